"""shared/config.py: the shipped config loads, and every bad config names what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from shared.config import (
    ConfigError,
    CoordinatorConfig,
    RunConfig,
    load_config,
    parse_config,
)

from .helpers import CARTPOLE_DQN, REPO


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _base() -> dict:
    return yaml.safe_load(CARTPOLE_DQN.read_text())


def test_cartpole_dqn_loads_with_its_values():
    cfg = load_config(CARTPOLE_DQN)
    assert isinstance(cfg, RunConfig)
    assert cfg.name == "cartpole-dqn"
    assert cfg.env.id == "CartPole-v1" and cfg.env.num_envs == 4
    assert cfg.algo.name == "dqn"
    assert cfg.algo.hidden_sizes == (128, 128)
    assert cfg.algo.lr == pytest.approx(0.0023)
    assert cfg.algo.target_update_every == 250
    assert cfg.collector.chunk_size == 128
    assert cfg.buffer.capacity == 100_000
    assert cfg.eval.stop_value == 475
    assert cfg.stop.max_wall_s == 600
    # sections the file leaves out take their defaults
    assert cfg.coordinator == CoordinatorConfig()


def test_every_shipped_config_loads():
    paths = sorted((REPO / "configs").glob("*.yaml"))
    assert paths
    for path in paths:
        load_config(path)


def test_config_is_frozen():
    cfg = load_config(CARTPOLE_DQN)
    with pytest.raises(ValidationError):
        cfg.algo.lr = 1.0


def test_loaded_config_round_trips_through_json():
    """The coordinator hands its config to workers as JSON; they must rebuild the same one."""
    cfg = load_config(CARTPOLE_DQN)
    assert parse_config(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize("section,key,dotted", [
    ("algo", "lrr", "algo.lrr"),
    ("env", "num_env", "env.num_env"),
    ("eval", "stop_valu", "eval.stop_valu"),
    ("coordinator", "heartbeat_s", "coordinator.heartbeat_s"),
])
def test_unknown_key_names_the_dotted_field(tmp_path, section, key, dotted):
    data = _base()
    data.setdefault(section, {})[key] = 1
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"'{dotted}'" in message
    assert str(path) in message
    assert "extra" in message.lower() or "not permitted" in message.lower()


def test_unknown_top_level_key(tmp_path):
    data = _base()
    data["algorithm"] = {"lr": 1}
    with pytest.raises(ConfigError, match="'algorithm'"):
        load_config(_write(tmp_path, data))


@pytest.mark.parametrize("section,key,value,dotted", [
    ("algo", "batch_size", "lots", "algo.batch_size"),
    ("algo", "lr", "fast", "algo.lr"),
    ("algo", "hidden_sizes", "wide", "algo.hidden_sizes"),
    ("env", "num_envs", [1, 2], "env.num_envs"),
    ("eval", "episodes", 2.5, "eval.episodes"),
    ("buffer", "capacity", {"n": 1}, "buffer.capacity"),
    ("buffer", "kind", "prioritised-typo", "buffer.kind"),
    ("algo", "gamma", 1.5, "algo.gamma"),
    ("algo", "batch_size", 0, "algo.batch_size"),
])
def test_wrong_type_or_range_names_the_field(tmp_path, section, key, value, dotted):
    data = _base()
    data[section][key] = value
    with pytest.raises(ConfigError, match=f"'{dotted}'"):
        load_config(_write(tmp_path, data))


def test_nested_list_item_error_names_the_index(tmp_path):
    data = _base()
    data["algo"]["hidden_sizes"] = [64, "x"]
    with pytest.raises(ConfigError, match=r"'algo\.hidden_sizes\.1'"):
        load_config(_write(tmp_path, data))


def test_every_problem_is_reported(tmp_path):
    data = _base()
    data["algo"]["lrr"] = 1
    data["env"]["num_envs"] = "four"
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data))
    assert "'algo.lrr'" in str(info.value) and "'env.num_envs'" in str(info.value)


def test_a_section_that_is_not_a_mapping(tmp_path):
    data = _base()
    data["algo"] = [1, 2]
    with pytest.raises(ConfigError, match="'algo'"):
        load_config(_write(tmp_path, data))


def test_missing_file_is_a_clear_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "No such file" in str(info.value)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)


@pytest.mark.parametrize("text", ["algo: {lr: 0.1\n", "algo:\n  lr: 1\n lr2: 2\n",
                                  "a: [1, 2\n", "\tname: x\n"])
def test_invalid_yaml_is_a_clear_error(tmp_path, text):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config(_write(tmp_path, text))


def test_empty_file_gives_the_defaults(tmp_path):
    assert load_config(_write(tmp_path, "")) == RunConfig()


@pytest.mark.parametrize("interval,timeout", [(1.0, 1.0), (2.0, 1.0), (5.0, 0.5)])
def test_heartbeat_timeout_must_exceed_interval(tmp_path, interval, timeout):
    data = _base()
    data["coordinator"] = {"heartbeat_interval_s": interval, "heartbeat_timeout_s": timeout}
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data))
    message = str(info.value)
    assert "'coordinator'" in message
    assert "heartbeat_timeout_s" in message and "heartbeat_interval_s" in message


def test_heartbeat_timeout_above_interval_is_fine():
    cfg = CoordinatorConfig(heartbeat_interval_s=0.5, heartbeat_timeout_s=0.6)
    assert cfg.heartbeat_timeout_s > cfg.heartbeat_interval_s


def test_bad_run_name_names_the_field():
    with pytest.raises(ConfigError, match="'name'"):
        parse_config({"name": "../escape"})


def test_with_overrides_validates_and_skips_none():
    cfg = load_config(CARTPOLE_DQN)
    assert cfg.with_overrides(seed=None, name=None) == cfg
    changed = cfg.with_overrides(seed=5, name="other")
    assert (changed.seed, changed.name) == (5, "other")
    assert changed.algo == cfg.algo
    with pytest.raises(ConfigError, match="overrides: field 'seed'"):
        cfg.with_overrides(seed="not a seed")
    with pytest.raises(ConfigError, match="overrides: field 'name'"):
        cfg.with_overrides(name="bad name")
