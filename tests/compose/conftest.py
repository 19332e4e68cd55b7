"""The compose suite needs a Docker engine: one that answers, the one `.ci/run` starts, or one
started here with the workplace's script. It skips, saying why, only where none can be had."""

from __future__ import annotations

import subprocess

import pytest

from bench.compose_stack import EngineUnavailable, ensure_engine


@pytest.fixture(scope="session")
def docker_env():
    try:
        env, started = ensure_engine()
    except EngineUnavailable as err:
        pytest.skip(f"no Docker engine: {err}")
    if subprocess.run(["docker", "compose", "version"], env=env,
                      capture_output=True).returncode != 0:
        pytest.skip("the Docker engine has no compose plugin (`docker compose version` fails)")
    yield env
    if started is not None:  # this suite started it: it stops it
        subprocess.run(["bash", str(started), "stop"], env=env, capture_output=True, timeout=120)
