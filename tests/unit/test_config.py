"""shared/contract/config.py: the shipped config loads, and every bad config names what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rlfleet.shared.contract.config import ConfigError, CoordinatorConfig, MixPart, RateLimitConfig
from rlfleet.shared.run.config import RunConfig, load_config, parse_config

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
    assert list(cfg.buffers) == ["replay"]
    replay = cfg.buffers["replay"]
    assert replay.kind == "uniform" and replay.capacity == 100_000
    # the replay ratio in items: 0.25 updates of 64 items per env step, 1000 updates of slack
    # and collectors wait while the learner is less than 219 updates ahead: it stays at the
    # top of the band, where the single-process runner trains
    assert replay.rate_limit == RateLimitConfig(min_size=1000, samples_per_insert=16,
                                                error_buffer=16_000, min_lead=14_000)
    assert cfg.eval.stop_value == 475
    assert cfg.stop.max_wall_s == 600
    # sections the file leaves out take their defaults
    assert cfg.coordinator == CoordinatorConfig()
    assert cfg.learner.mix == (MixPart(buffer="replay", fraction=1.0),)
    assert cfg.learner.by_buffer is None and cfg.collector.insert_into is None


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


def _section(data: dict, path: str) -> dict:
    """The mapping at a dotted path of a config dict, created where missing."""
    for key in path.split("."):
        data = data.setdefault(key, {})
    return data


@pytest.mark.parametrize("section,key,dotted", [
    ("algo", "lrr", "algo.lrr"),
    ("env", "num_env", "env.num_env"),
    ("eval", "stop_valu", "eval.stop_valu"),
    ("coordinator", "heartbeat_s", "coordinator.heartbeat_s"),
    ("buffers.replay", "capacityy", "buffers.replay.capacityy"),
    ("buffers.replay.rate_limit", "min_items", "buffers.replay.rate_limit.min_items"),
    ("learner", "mixes", "learner.mixes"),
    # an earlier layout's keys, whose work the per-buffer rate limit does, are errors, not
    # silently ignored
    ("algo", "learning_starts", "algo.learning_starts"),
    ("algo", "updates_per_env_step", "algo.updates_per_env_step"),
    ("algo", "ratio_tolerance", "algo.ratio_tolerance"),
])
def test_unknown_key_names_the_dotted_field(tmp_path, section, key, dotted):
    data = _base()
    _section(data, section)[key] = 1
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"'{dotted}'" in message
    assert str(path) in message
    assert "extra" in message.lower() or "not permitted" in message.lower()


@pytest.mark.parametrize("key", ["algorithm", "buffer"])
def test_unknown_top_level_key(tmp_path, key):
    data = _base()
    data[key] = {"capacity": 1}
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(_write(tmp_path, data))


@pytest.mark.parametrize("section,key,value,dotted", [
    ("algo", "batch_size", "lots", "algo.batch_size"),
    ("algo", "lr", "fast", "algo.lr"),
    ("algo", "hidden_sizes", "wide", "algo.hidden_sizes"),
    ("env", "num_envs", [1, 2], "env.num_envs"),
    ("eval", "episodes", 2.5, "eval.episodes"),
    ("buffers.replay", "capacity", {"n": 1}, "buffers.replay.capacity"),
    ("buffers.replay", "kind", "prioritised-typo", "buffers.replay.kind"),
    ("buffers.replay", "capacity", 0, "buffers.replay.capacity"),
    ("buffers.replay", "alpha", -0.5, "buffers.replay.alpha"),
    ("buffers.replay", "beta", 1.5, "buffers.replay.beta"),
    ("buffers.replay", "sequence_length", 0, "buffers.replay.sequence_length"),
    ("buffers.replay", "max_policy_lag", -1, "buffers.replay.max_policy_lag"),
    ("buffers.replay.rate_limit", "min_size", 0, "buffers.replay.rate_limit.min_size"),
    ("buffers.replay.rate_limit", "samples_per_insert", 0,
     "buffers.replay.rate_limit.samples_per_insert"),
    ("buffers.replay.rate_limit", "error_buffer", -1, "buffers.replay.rate_limit.error_buffer"),
    ("learner", "mix", [{"buffer": "replay", "fraction": 0}], "learner.mix.0.fraction"),
    ("coordinator", "snapshot_interval_s", 0, "coordinator.snapshot_interval_s"),
    ("algo", "priority_eps", 0, "algo.priority_eps"),
    ("algo", "gamma", 1.5, "algo.gamma"),
    ("algo", "batch_size", 0, "algo.batch_size"),
    ("learner", "torch_threads", 0, "learner.torch_threads"),
])
def test_wrong_type_or_range_names_the_field(tmp_path, section, key, value, dotted):
    data = _base()
    _section(data, section)[key] = value
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


# -- buffers, the learner's mix and where collectors insert ----------------------------------

def test_several_buffers_of_every_kind_load():
    data = _base()
    data["buffers"] = {
        "recent": {"kind": "uniform", "capacity": 5000, "sample_range": 1000,
                   "replacement": False},
        "prio": {"kind": "prioritized", "alpha": 0.7, "beta": 0.5,
                 "rate_limit": {"min_size": 500, "samples_per_insert": 32,
                                "error_buffer": 6400}},
        "seq": {"kind": "episode", "sequence_length": 8},
        "fresh": {"kind": "queue", "max_policy_lag": 2},
    }
    data["learner"] = {"mix": [{"buffer": "recent", "fraction": 0.25},
                               {"buffer": "prio", "fraction": 0.75}]}
    data["collector"]["insert_into"] = ["recent", "prio"]
    cfg = parse_config(data)
    assert [b.kind for b in cfg.buffers.values()] == ["uniform", "prioritized", "episode",
                                                      "queue"]
    assert cfg.buffers["prio"].rate_limit.samples_per_insert == 32
    assert cfg.buffers["seq"].rate_limit == RateLimitConfig()  # free-running by default
    assert [m.buffer for m in cfg.learner.mix] == ["recent", "prio"]
    assert cfg.collector.insert_into == ("recent", "prio")
    assert parse_config(cfg.model_dump(mode="json")) == cfg


def _mix(*parts: tuple[str, float]) -> dict:
    return {"mix": [{"buffer": b, "fraction": f} for b, f in parts]}


@pytest.mark.parametrize("change,message", [
    ({"buffers": {}}, "at least one buffer"),
    ({"buffers": {"../x": {}}}, "must be letters, digits"),
    ({"learner": _mix(("nope", 1.0))}, "learner.mix names buffer 'nope'"),
    ({"learner": _mix(("replay", 0.5))}, "learner.mix fractions sum to 0.5, not 1"),
    ({"learner": _mix(("replay", 0.5), ("replay", 0.7))}, "fractions sum to 1.2"),
    ({"learner": {"by_buffer": {"replay": 32}}},
     "field 'learner.by_buffer': Value error, one batch per buffer is not supported"),
    ({"collector": {"chunk_size": 128, "insert_into": ["replay", "nope"]}},
     "collector.insert_into names buffer 'nope'"),
    # a band narrower than one batch: each side would wait for the other forever
    ({"buffers": {"replay": {"rate_limit": {"samples_per_insert": 16, "error_buffer": 63}}}},
     "buffers.replay.rate_limit.error_buffer=63.0 is smaller than the 64 items"),
    # an episode buffer's batch is sequences: 64 x 4 items
    ({"buffers": {"replay": {"kind": "episode", "sequence_length": 4, "rate_limit": {
        "samples_per_insert": 64, "error_buffer": 255}}}}, "smaller than the 256 items"),
    # a lopsided band must still hold a batch between its edges
    ({"buffers": {"replay": {"rate_limit": {"samples_per_insert": 16, "error_buffer": 1000,
                                            "min_lead": 937}}}},
     "buffers.replay.rate_limit.min_lead=937.0 leaves less than the 64 items of one batch"),
])
def test_inconsistent_buffers_are_errors(change, message):
    data = {**_base(), **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(data)


def test_the_error_buffer_check_counts_each_buffers_share_of_the_batch():
    """A buffer that gives 16 of 64 items per batch needs a band of 16 items, not 64."""
    data = _base()
    data["buffers"] = {"a": {"rate_limit": {"samples_per_insert": 4, "error_buffer": 16}},
                       "b": {}}
    data["learner"] = _mix(("a", 0.25), ("b", 0.75))
    assert parse_config(data).buffers["a"].rate_limit.error_buffer == 16
    data["buffers"]["a"]["rate_limit"]["error_buffer"] = 15
    with pytest.raises(ConfigError, match="smaller than the 16 items"):
        parse_config(data)
    # without a ratio nobody waits for anybody: any band will do
    data["buffers"]["a"]["rate_limit"] = {"samples_per_insert": None, "error_buffer": 1}
    parse_config(data)


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
