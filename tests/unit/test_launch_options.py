"""The options a launch takes (`services/local/options.py`, `LaunchOptions`): what the
command line builds from its parsed options is what the Python API builds from keyword
arguments, it survives the JSON the API hands its child, and a value it refuses is a
`ConfigError` naming the field."""

from __future__ import annotations

import json

import pytest

from rlfleet.cli import build_parser
from rlfleet.command import parse_command
from rlfleet.commands.launch import resume_options, up_options
from rlfleet.local.options import LaunchOptions
from rlfleet.shared.contract.config import ConfigError


def test_the_command_line_builds_what_keyword_arguments_build():
    args = parse_command(build_parser(), ["up", "--config", "c.yaml", "--seed", "3",
                                          "--max-env-steps", "900", "--quiet", "algo.lr=1e-3"])
    assert up_options(args) == LaunchOptions(config="c.yaml", seed=3, max_env_steps=900,
                                             quiet=True, overrides=("algo.lr=1e-3",),
                                             collectors=2)
    args = parse_command(build_parser(), ["resume", "runs/x", "--collectors", "4", "a=1"])
    assert resume_options(args) == LaunchOptions(resume=True, run_dir="runs/x",
                                                 collectors=4, overrides=("a=1",))


def test_options_survive_their_json():
    options = LaunchOptions(config="cartpole-dqn", overrides=("algo.lr=3e-4",), port=8123,
                            max_wall_s=60.5, learners=2, run_dir="/tmp/run")
    assert LaunchOptions.model_validate_json(options.model_dump_json()) == options


@pytest.mark.parametrize(("fields", "message"), [
    ({"config": "c", "collectors": "many"}, "collectors='many': "),
    ({"config": "c", "max_restarts": -1}, "max_restarts=-1: "),
    ({"config": "c", "ports": 9}, "ports=9: "),
    ({}, "config: a new run needs a config"),
    ({"resume": True}, "run_dir: a resume needs the run directory"),
    ({"resume": True, "run_dir": "runs/x", "storage": "/tmp/s"}, "storage: a resume keeps"),
])
def test_a_refused_option_names_its_field(fields, message):
    with pytest.raises(ConfigError) as err:
        LaunchOptions.checked(**fields)
    assert str(err.value).startswith(message)


def test_the_api_child_refuses_options_it_cannot_take_as_the_command_would(tmp_path, capsys):
    from rlfleet.api_child import OPTIONS_FILE, main, write_options

    path = tmp_path / OPTIONS_FILE
    path.write_text(json.dumps({"command": "up",
                                "options": {"config": "c.yaml", "collectors": "many"}}))
    assert main([str(path)]) == 2
    assert capsys.readouterr().err.startswith("rlfleet up: collectors='many': ")
    # What a `Run` writes is what the child reads back.
    write_options(path, "up", LaunchOptions(config="c.yaml", overrides=("a=1",), port=9))
    assert LaunchOptions(**json.loads(path.read_text())["options"]) == LaunchOptions(
        config="c.yaml", overrides=("a=1",), port=9)
