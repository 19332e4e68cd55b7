"""Dotted `KEY=VALUE` overrides (`shared/run/overrides.py`): their values' types, nested
fields, lists and mappings, errors that name the dotted field and the override, the round trip
the Python API relies on, and what `rlfleet up` and `rlfleet resume` do with them (the real
parser and `make_plan`, writing real run directories)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlfleet.cli import build_parser
from rlfleet.commands.launch import resume_options, up_options
from rlfleet.local.plan import make_plan
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import load_config, parse_config
from rlfleet.shared.run.overrides import (
    apply_overrides,
    format_override,
    parse_override,
    parse_overrides,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "cartpole-dqn.yaml")


@pytest.mark.parametrize(("text", "value"), [
    ("3e-4", 3e-4), ("1e5", 1e5), ("1E-2", 0.01), ("-2", -2), ("+7", 7), ("0.5", 0.5),
    (".5", 0.5), ("-1.5e+3", -1500.0), ("true", True), ("false", False), ("null", None),
    ("", None), ("hello", "hello"), ("'3e-4'", "3e-4"), ("'true'", "true"),
    ("[1, 2]", [1, 2]), ("{a: 1, b: [x]}", {"a": 1, "b": ["x"]}),
])
def test_values_are_yaml_with_yaml_1_2_numbers(text: str, value):
    key, parsed = parse_override(f"algo.lr={text}")
    assert key == "algo.lr" and parsed == value and type(parsed) is type(value)


def test_typed_fields_of_a_real_config():
    cfg = load_config(CONFIG, ["algo.lr=3e-4", "algo.batch_size=1.28e2", "seed=-2",
                               "env.num_envs=16", "eval.stop_value=1e2",
                               "logging.tensorboard=false", "storage=null",
                               "algo.hidden_sizes=[64, 32]"])
    assert cfg.algo.lr == pytest.approx(3e-4) and isinstance(cfg.algo.lr, float)
    assert cfg.algo.batch_size == 128 and isinstance(cfg.algo.batch_size, int)
    assert cfg.seed == -2 and cfg.env.num_envs == 16 and cfg.eval.stop_value == 100.0
    assert cfg.logging.tensorboard is False and cfg.storage is None
    assert cfg.algo.hidden_sizes == (64, 32)
    # Untouched fields keep the file's values.
    assert cfg.algo.gamma == 0.99 and cfg.env.id == "CartPole-v1"


def test_nested_fields_lists_and_mappings():
    cfg = load_config(CONFIG, [
        "buffers.replay.capacity=5000", "buffers.replay.rate_limit.min_size=200",
        "buffers.replay.rate_limit.samples_per_insert=null",
        "buffers.fresh={kind: uniform, capacity: 2000}",
        "learner.mix=[{buffer: replay, fraction: 0.5}, {buffer: fresh, fraction: 0.5}]",
    ])
    assert cfg.buffers["replay"].capacity == 5000
    assert cfg.buffers["replay"].rate_limit.min_size == 200
    assert cfg.buffers["fresh"].capacity == 2000
    assert [(p.buffer, p.fraction) for p in cfg.learner.mix] == [("replay", 0.5),
                                                                 ("fresh", 0.5)]
    # A list's items by index, and a section the file lacks is created.
    cfg = load_config(CONFIG, ["learner.mix=[{buffer: replay, fraction: 1.0}]",
                               "learner.mix.0.fraction=1", "checkpoint.keep_last=7"])
    assert cfg.learner.mix[0].fraction == 1.0 and cfg.checkpoint.keep_last == 7


def test_a_mapping_and_later_items_win():
    assert load_config(CONFIG, {"algo.lr": 1e-4, "env.num_envs": 2}).algo.lr == 1e-4
    assert load_config(CONFIG, ["algo.lr=1e-4", "algo.lr=2e-4"]).algo.lr == 2e-4
    # A whole section, then a field of it.
    cfg = load_config(CONFIG, ["env={id: CartPole-v1}", "env.num_envs=3"])
    assert cfg.env.num_envs == 3
    assert load_config(CONFIG, iter(["algo.lr=5e-4"])).algo.lr == 5e-4  # any iterable


def test_parse_config_takes_overrides_of_a_dict_config():
    cfg = parse_config({"env": {"id": "CartPole-v1"}, "algo": {"name": "dqn"}},
                       overrides=["algo.lr=0.01"])
    assert cfg.algo.lr == 0.01


@pytest.mark.parametrize(("items", "words"), [
    (["algo.lrr=1"], ["override algo.lrr=1", "'algo.lrr'", "did you mean 'lr'"]),
    (["collector.num_envs=16"], ["override collector.num_envs=16", "'collector.num_envs'",
                                 "Extra inputs"]),
    (["buffers.replay.capcity=3"], ["'buffers.replay.capcity'", "did you mean 'capacity'"]),
    (["nosuch.field=1"], ["override nosuch.field=1", "'nosuch'", "the fields here"]),
    (["algo.lr=-1"], ["override algo.lr=-1", "'algo.lr'", "greater than 0"]),
    (["algo.batch_size=1.5"], ["'algo.batch_size'", "fractional part"]),
    (["seed=abc"], ["override seed=abc", "'seed'", "valid integer"]),
    (["learner.mix=[{buffer: nope, fraction: 1.0}]"], ["'learner.mix'", "'nope'"]),
    (["algo.name=ppo"], ["override algo.name=ppo", "'algo.eps_end'"]),
    ({"algo.lrr": 1}, ["override algo.lrr=1", "'algo.lrr'"]),
])
def test_unknown_and_bad_fields_are_named_with_the_override(items, words):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG, items)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_key_through_a_value_without_fields_is_named():
    with pytest.raises(ConfigError, match=r"env\.id\.x=1: env\.id is 'CartPole-v1', which "
                       r"has no field 'x'"):
        load_config(CONFIG, ["env.id.x=1"])
    with pytest.raises(ConfigError, match=r"learner\.mix is a list of 1; index it by 0 to 0"):
        load_config(CONFIG, ["learner.mix=[{buffer: replay, fraction: 1.0}]",
                             "learner.mix.3.fraction=1"])


@pytest.mark.parametrize(("item", "words"), [
    ("algo.lr", "override 'algo.lr': expected KEY=VALUE"),
    ("=3", "override '=3': the key before '=' is empty"),
    ("algo..lr=3", "override 'algo..lr=3': a key is field names joined by dots"),
    ("algo lr=3", "override 'algo lr=3': a key is"),
    ("learner.mix=[{buffer: replay", "override 'learner.mix=[{buffer: replay': not valid YAML"),
])
def test_malformed_items_are_named(item: str, words: str):
    with pytest.raises(ConfigError) as err:
        parse_overrides([item])
    assert words in str(err.value)
    with pytest.raises(ConfigError):
        parse_overrides(item)  # one string, not a list of items


@pytest.mark.parametrize("value", [
    3e-4, 1e5, 1e-10, -2, 0, 16, True, False, None, "3e-4", "1e5", "true", "null", "a b",
    "x: y", "- a", "#c", "it's", "a\nb", "", [1, 2.5, "x"], (64, 64),
    {"buffer": "replay", "fraction": 1.0}, [{"buffer": "replay", "fraction": 1.0}],
    math.inf, -math.inf,
])
def test_format_override_parses_back_to_the_same_value(value):
    text = format_override("algo.params.x", value)
    assert "\n" not in text
    key, back = parse_override(text)
    expected = list(value) if isinstance(value, tuple) else value
    assert key == "algo.params.x" and back == expected and type(back) is type(expected)
    nan = parse_override(format_override("k", math.nan))[1]
    assert math.isnan(nan)


def test_format_override_refuses_what_yaml_cannot_hold():
    with pytest.raises(ConfigError, match="override value"):
        format_override("algo.params.x", object())
    with pytest.raises(ConfigError, match="a key is"):
        format_override("algo lr", 1)


def test_apply_overrides_leaves_the_data_it_was_given():
    data = {"algo": {"name": "dqn", "hidden_sizes": [1]}}
    out = apply_overrides(data, {"algo.hidden_sizes.0": 2, "env.id": "x"})
    assert data == {"algo": {"name": "dqn", "hidden_sizes": [1]}}
    assert out == {"algo": {"name": "dqn", "hidden_sizes": [2]}, "env": {"id": "x"}}


# -- rlfleet up and rlfleet resume ----------------------------------------------------------

def plan_of(*argv: str):
    args = build_parser().parse_args(argv)
    return make_plan(resume_options(args) if args.command == "resume" else up_options(args))


def test_up_writes_the_overridden_config_to_the_run_directory(tmp_path: Path):
    plan = plan_of("up", "--config", CONFIG, "--run-dir", str(tmp_path / "run"), "--seed", "3",
                   "algo.lr=3e-4", "env.num_envs=16",
                   "learner.mix=[{buffer: replay, fraction: 1.0}]", "eval.episodes=5")
    written = load_config(plan.config_path)
    assert written == plan.config
    assert written.algo.lr == pytest.approx(3e-4) and written.env.num_envs == 16
    assert written.eval.episodes == 5 and written.seed == 3
    assert "lr: 0.0003" in plan.config_path.read_text()
    assert plan.overrides == ("algo.lr=3e-4", "env.num_envs=16",
                              "learner.mix=[{buffer: replay, fraction: 1.0}]",
                              "eval.episodes=5")
    # Shown at start, on the headline's second line (rich markup: brackets stay as given).
    from rich.text import Text

    shown = Text.from_markup(plan.headline()).plain.split("\n")[1]
    assert shown == f"overrides: {' '.join(plan.overrides)}"
    tricky = plan_of("up", "--config", CONFIG, "--run-dir", str(tmp_path / "run2"),
                     "algo.params={tag: '[bold]x[/bold]'}")
    assert Text.from_markup(tricky.headline()).plain.endswith(
        "overrides: algo.params={tag: '[bold]x[/bold]'}")


def test_up_refuses_a_bad_override_before_anything_is_written(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"override algo\.lrr=1: field 'algo\.lrr'"):
        plan_of("up", "--config", CONFIG, "--run-dir", str(tmp_path / "run"), "algo.lrr=1")
    assert not (tmp_path / "run").exists()


def test_resume_takes_overrides_and_keeps_them(tmp_path: Path):
    run_dir = tmp_path / "run"
    plan_of("up", "--config", CONFIG, "--run-dir", str(run_dir), "algo.lr=3e-4")
    plan = plan_of("resume", str(run_dir), "algo.lr=1e-4", "eval.episodes=4",
                   "stop.max_env_steps=5000")
    again = load_config(run_dir / "config.yaml")
    assert again == plan.config and again.algo.lr == 1e-4 and again.eval.episodes == 4
    assert again.stop.max_env_steps == 5000 and plan.overrides[0] == "algo.lr=1e-4"
    # Setting a fixed field to the value it has is no change.
    plan_of("resume", str(run_dir), "env.id=CartPole-v1", "algo.name=dqn")


@pytest.mark.parametrize(("item", "field", "why"), [
    ("env.id=Acrobot-v1", "env", "observations and actions"),
    ("env.num_envs=8", "env", "observations and actions"),
    ("algo.name=ppo", "algo.name", "this algorithm's networks"),
    ("algo={name: dqn, hidden_sizes: [32]}", "algo.hidden_sizes", "layer widths"),
    ("algo.hidden_sizes=[64]", "algo.hidden_sizes", "layer widths"),
    ("buffers.replay.capacity=5000", "buffers", "snapshot"),
    ("name=other", "name", "storage namespace"),
    ("storage=/tmp/elsewhere", "storage", "snapshot"),
])
def test_resume_refuses_what_the_stored_run_was_made_for(tmp_path: Path, item, field, why):
    run_dir = tmp_path / "run"
    plan_of("up", "--config", CONFIG, "--run-dir", str(run_dir))
    before = (run_dir / "config.yaml").read_text()
    with pytest.raises(ConfigError) as err:
        plan_of("resume", str(run_dir), item)
    message = str(err.value)
    assert f"override {item}" in message and f"cannot change {field} " in message
    assert why in message and "rlfleet up" in message
    assert (run_dir / "config.yaml").read_text() == before


def test_items_may_come_anywhere_after_the_options():
    from rlfleet.command import parse_command

    args = parse_command(build_parser(), ["resume", "runs/x", "--max-env-steps", "9",
                                          "algo.lr=1e-4", "--continue", "eval.episodes=2"])
    assert args.run_dir == "runs/x" and args.max_env_steps == 9 and args.continue_run
    assert args.overrides == ["algo.lr=1e-4", "eval.episodes=2"]
    args = parse_command(build_parser(), ["up", "--config", "c", "--", "algo.lr=1"])
    assert args.overrides == ["algo.lr=1"]
    with pytest.raises(SystemExit):  # an unknown option stays argparse's error
        parse_command(build_parser(), ["up", "--config", "c", "a=1", "--typo", "b=2"])
    with pytest.raises(SystemExit):  # and so does an item for a command without overrides
        parse_command(build_parser(), ["status", "algo.lr=1"])


def test_single_trains_the_overridden_config(tmp_path: Path, capsys):
    from rlfleet.cli import main

    code = main(["single", "--config", CONFIG, "--run-dir", str(tmp_path / "run"),
                 "stop.max_env_steps=600", "eval.every_env_steps=300", "eval.episodes=1",
                 "eval.num_envs=1", "algo.lr=3e-4"])
    assert code == 3  # stopped unsolved at its (overridden) budget
    assert "overrides: stop.max_env_steps=600 " in capsys.readouterr().out
    cfg = load_config(tmp_path / "run" / "config.yaml")
    assert cfg.algo.lr == 3e-4 and cfg.stop.max_env_steps == 600
