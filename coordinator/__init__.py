"""The coordinator: membership and tasks, the run's replay, learner aggregation, evaluation,
durability and the run's state, behind a Flask app (`create_app`).

What starts a coordinator (the `rlfleet coordinator` command, the single-process runner)
imports these names from here; the modules below are the coordinator's own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.coordinator.app import create_app
    from rlfleet.coordinator.service import Coordinator

__all__ = ["Coordinator", "create_app"]

_EXPORTS = {"Coordinator": "rlfleet.coordinator.service", "create_app": "rlfleet.coordinator.app"}


def __getattr__(name: str) -> Any:
    """Imported on first use: a process that imports one coordinator module pays for no
    other."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlfleet.coordinator' has no attribute {name!r}")
    return vars(importlib.import_module(module))[name]
