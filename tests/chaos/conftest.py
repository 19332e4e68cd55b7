"""Fixtures of the chaos suite: `rlfleet up` runs that are stopped and swept up afterwards."""

from __future__ import annotations

import pytest
from integration.helpers import Up


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
