"""The shipped gunicorn config refuses what would run a second coordinator of the run, before
any worker starts: real gunicorn, started as an operator would, and gunicorn's own `Config`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gunicorn.config import Config

from rlfleet.gunicorn_conf import SettingError, check_gunicorn

from .helpers import free_port

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "python:rlfleet.gunicorn_conf",
            "rlfleet.wsgi:coordinator_app()"]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cartpole-dqn.yaml"


def gunicorn(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """gunicorn with the shipped config and a coordinator that would otherwise start."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("WEB_CONCURRENCY", "GUNICORN_CMD_ARGS") and not k.startswith("RLFLEET_")}
    base.update(RLFLEET_CONFIG=str(CONFIG), RLFLEET_RUN_DIR=str(tmp_path / "run"),
                RLFLEET_STORAGE=str(tmp_path / "storage"), RLFLEET_PORT=str(free_port()))
    return subprocess.run([*GUNICORN[:3], *args, *GUNICORN[3:]], env={**base, **env},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("args, env, named", [
    (["-w", "2"], {}, "gunicorn workers=2"),
    ([], {"WEB_CONCURRENCY": "3"}, "gunicorn workers=3"),
    ([], {"GUNICORN_CMD_ARGS": "--workers 2"}, "gunicorn workers=2"),
    (["--max-requests", "1000"], {}, "gunicorn max_requests=1000"),
    (["--preload"], {}, "gunicorn preload_app=True"),
])
def test_more_than_one_coordinator_is_refused_before_any_worker_starts(tmp_path, args, env,
                                                                       named):
    done = gunicorn(tmp_path, *args, **env)
    assert done.returncode == 2, done.stderr
    assert f"rlfleet coordinator: {named}" in done.stderr, done.stderr
    assert "Booting worker" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_bad_setting_is_one_line_naming_it(tmp_path):
    done = gunicorn(tmp_path, RLFLEET_CONFIG=str(tmp_path / "missing.yaml"))
    assert done.returncode == 2, done.stderr
    assert "rlfleet coordinator: cannot read config file" in done.stderr, done.stderr
    assert "Booting worker" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    for name, value in (("RLFLEET_PORT", "8k"), ("RLFLEET_THREADS", "0")):
        done = gunicorn(tmp_path, **{name: value})
        assert done.returncode == 2, done.stderr
        assert f"rlfleet coordinator: {name}='{value}'" in done.stderr, done.stderr


def test_gunicorn_config_objects_are_checked_by_setting():
    cfg = Config()
    cfg.set("workers", 1)
    check_gunicorn(cfg)  # gunicorn's defaults and one worker: nothing to refuse
    for name, value in (("workers", 4), ("max_requests", 10), ("reload", True),
                        ("preload_app", True)):
        bad = Config()
        bad.set("workers", 1)
        bad.set(name, value)
        with pytest.raises(SettingError, match=f"gunicorn {name}={value!r}"):
            check_gunicorn(bad)
