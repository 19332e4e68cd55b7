"""Fixtures of the chaos suite: the integration suite's `launch` (rlfleet up runs that are
swept up afterwards)."""

from integration.conftest import launch  # noqa: F401 - a fixture, found by name
