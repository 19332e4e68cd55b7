"""`RLFLEET_*` variables on the command line's side (`services/command.py`): a bad value is a
usage error naming the variable (exit 2, one line, no traceback) in the commands that use it,
and harmless in the commands that do not; an explicit bad option keeps argparse's own error.
And the coordinator's overrides: `RLFLEET_OVERRIDES`, then those on its command line, as
compose, Kubernetes and gunicorn's entry point (`coordinator_factory`) apply them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.cli import main
from rlfleet.roles import build_parser as roles_parser
from rlfleet.roles import coordinator_factory
from rlfleet.shared.contract.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "cartpole-dqn.yaml")


@pytest.fixture(autouse=True)
def _no_rlfleet_env(monkeypatch):
    """Only the variables a test sets."""
    for name in list(os.environ):
        if name.startswith("RLFLEET_"):
            monkeypatch.delenv(name)


def usage_error(capsys, argv: list[str]) -> str:
    """The stderr of a command line that argparse refuses (exit 2)."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("name", "value", "argv", "expected"), [
    ("PORT", "8k", ["coordinator", "--config", CONFIG], "a port number"),
    ("PORT", "70000", ["coordinator", "--config", CONFIG], "0 to 65535"),
    ("PORT", "8k", ["collector", "--coordinator", "http://127.0.0.1:1"], "a port number"),
    ("PORT", "8k", ["serve-policy", "runs/x"], "a port number"),
    ("THREADS", "many", ["coordinator", "--config", CONFIG], "1 or more"),
    ("THREADS", "0", ["serve-policy", "runs/x"], "1 or more"),
    ("SEED", "x", ["coordinator", "--config", CONFIG], "an integer"),
    ("RESUME", "maybe", ["coordinator", "--config", CONFIG], "1 or 0"),
    ("EVALUATE_ONLY", "2", ["collector"], "1 or 0"),
    ("RELOAD_S", "soon", ["serve-policy", "runs/x"], "seconds"),
    ("MAX_RESTARTS", "-1", ["up", "--config", CONFIG], "0 or more"),
    ("MAX_RESTARTS", "x", ["resume", "runs/x"], "0 or more"),
    ("GRACE_S", "x", ["scaler"], "seconds"),
    ("MAX_COLLECTORS", "x", ["scaler"], "an integer"),
    ("MIN_ENV_STEPS_PER_S", "fast", ["scaler"], "a number"),
])
def test_a_bad_variable_is_a_usage_error_naming_it(capsys, monkeypatch, name, value, argv,
                                                    expected):
    monkeypatch.setenv(f"RLFLEET_{name}", value)
    err = usage_error(capsys, argv)
    line = err.strip().splitlines()[-1]
    assert f"RLFLEET_{name}={value!r}" in line and expected in line, err
    assert "Traceback" not in err


def test_an_explicit_bad_option_keeps_argparse_s_message(capsys, monkeypatch):
    err = usage_error(capsys, ["coordinator", "--config", CONFIG, "--port", "8k"])
    assert "argument --port: invalid int value: '8k'" in err and "RLFLEET" not in err
    # The option given wins over a bad variable, which is then never converted.
    monkeypatch.setenv("RLFLEET_PORT", "8k")
    args = roles_parser().parse_args(["coordinator", "--port", "8123"])
    assert args.port == 8123


def test_a_command_that_does_not_use_a_variable_ignores_it(capsys, monkeypatch):
    for name in ("PORT", "THREADS", "SEED", "RESUME", "RELOAD_S", "MAX_RESTARTS", "GRACE_S",
                 "STORAGE_RETRY_S", "LOG_LEVEL"):
        monkeypatch.setenv(f"RLFLEET_{name}", "bad")
    with pytest.raises(SystemExit) as done:
        main(["status", "--help"])
    assert done.value.code == 0
    # status uses none of them: it fails only at the (closed) coordinator it asks.
    assert main(["status", "--coordinator", "http://127.0.0.1:1"]) == 1
    assert "RLFLEET_" not in capsys.readouterr().err
    assert main(["check", "--config", CONFIG]) == 0


def test_variables_convert_to_the_option_s_type(monkeypatch):
    for name, value in (("PORT", "8123"), ("THREADS", "3"), ("SEED", "-4"), ("RESUME", "yes")):
        monkeypatch.setenv(f"RLFLEET_{name}", value)
    args = roles_parser().parse_args(["coordinator"])
    assert (args.port, args.threads, args.seed, args.resume) == (8123, 3, -4, True)
    monkeypatch.setenv("RLFLEET_RESUME", "0")
    assert roles_parser().parse_args(["coordinator"]).resume is False
    monkeypatch.delenv("RLFLEET_RESUME")
    args = roles_parser().parse_args(["coordinator", "--resume"])
    assert args.resume is True and args.overrides == []


@pytest.mark.parametrize(("name", "value", "argv"), [
    ("LOG_LEVEL", "loud", ["single", "--config", CONFIG]),
    ("STORAGE_RETRY_S", "soon", ["collector", "--coordinator", "http://127.0.0.1:1"]),
    ("STORAGE_PASSWORD_FILE", "/nonexistent/pw", ["learner", "--coordinator",
                                                  "http://127.0.0.1:1"]),
    ("MAX_BODY_BYTES", "lots", ["coordinator", "--config", CONFIG]),
])
def test_environment_only_settings_fail_in_one_line(capsys, monkeypatch, name, value, argv):
    monkeypatch.setenv(f"RLFLEET_{name}", value)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlfleet {argv[0]}: RLFLEET_{name}") and "\n" not in err, err


def test_the_log_level_is_a_name_logging_knows(monkeypatch):
    from rlfleet.command import log_level

    monkeypatch.setenv("RLFLEET_LOG_LEVEL", "WARNING")
    assert log_level() == "WARNING"
    monkeypatch.setenv("RLFLEET_LOG_LEVEL", "debug")  # logging itself would refuse it
    with pytest.raises(ConfigError, match="RLFLEET_LOG_LEVEL='debug': expected one of DEBUG"):
        log_level()


# -- the coordinator's overrides --------------------------------------------------------------

def coordinator_config(monkeypatch, tmp_path: Path, *argv: str, env: str | None = None):
    """The config `rlfleet coordinator` would serve, from its real parser and factory."""
    if env is not None:
        monkeypatch.setenv("RLFLEET_OVERRIDES", env)
    args = roles_parser().parse_args(["coordinator", "--config", CONFIG, "--run-dir",
                                      str(tmp_path / "run"), *argv])
    app = coordinator_factory(args)()
    return app.extensions["rlfleet"].cfg


def test_coordinator_applies_the_variable_then_its_command_line(monkeypatch, tmp_path: Path):
    cfg = coordinator_config(
        monkeypatch, tmp_path, "algo.lr=2e-4", "eval.episodes=3",
        env="algo.lr=3e-4 env.num_envs=16 'learner.mix=[{buffer: replay, fraction: 1.0}]'")
    assert cfg.algo.lr == 2e-4  # the command line's, applied after the variable's
    assert cfg.env.num_envs == 16 and cfg.eval.episodes == 3
    assert cfg.learner.mix[0].fraction == 1.0


@pytest.mark.parametrize(("value", "words"), [
    ("algo.lr=3e-4 'oops", "RLFLEET_OVERRIDES=\"algo.lr=3e-4 'oops\": cannot split it"),
    ("algo.lr", "RLFLEET_OVERRIDES: 'algo.lr' is not KEY=VALUE"),
    ("algo.lrr=1", "override algo.lrr=1: field 'algo.lrr'"),
])
def test_coordinator_names_a_bad_override_variable(monkeypatch, tmp_path: Path, value, words):
    with pytest.raises(ConfigError) as err:
        coordinator_config(monkeypatch, tmp_path, env=value)
    assert words in str(err.value)


def test_up_does_not_pass_the_coordinator_s_variable_on(capsys, monkeypatch, tmp_path: Path):
    """`up`'s children read config.yaml, overrides applied: RLFLEET_OVERRIDES stops at `up`."""
    monkeypatch.setenv("RLFLEET_OVERRIDES", "algo.lr=1e-4")
    assert main(["up", "--config", CONFIG, "--run-dir", str(tmp_path / "run"),
                 "algo.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "ignoring RLFLEET_OVERRIDES" in err and "'algo.lrr'" in err
    assert "RLFLEET_OVERRIDES" not in os.environ


# -- the real command, as a user runs it ----------------------------------------------------

def rlfleet(*argv: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLFLEET_")}
    return subprocess.run([sys.executable, "-m", "rlfleet", *argv], cwd=REPO, text=True,
                          capture_output=True, timeout=120, env={**clean, **env})


def test_the_command_exits_2_naming_a_bad_port_and_0_for_help_elsewhere():
    done = rlfleet("coordinator", "--config", "configs/cartpole-dqn.yaml", RLFLEET_PORT="8k")
    assert done.returncode == 2 and "RLFLEET_PORT='8k'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = rlfleet("status", "--help", RLFLEET_PORT="8k")
    assert done.returncode == 0 and "--coordinator" in done.stdout, done.stderr
