"""Fixtures of the integration tests (helpers live in `helpers.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import Processes, Up, wait_for


@pytest.fixture
def processes(tmp_path: Path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()
    wait_for(lambda: not procs.leftovers(), 15, "every started process to exit")


@pytest.fixture
def launch():
    started: list[Up] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Up:
        up = Up(*args, env=env)
        started.append(up)
        return up

    yield start
    for up in started:
        up.kill_leftovers()
