"""The coordinator: membership and tasks, the run's replay, learner aggregation, evaluation,
durability and the run's state, behind a Flask app (`create_app`).

What starts a coordinator (the `rlfleet coordinator` command, the single-process runner)
imports these names from here; the modules below are the coordinator's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.shared.util.imports import lazy_exports

if TYPE_CHECKING:
    from rlfleet.coordinator.app import create_app
    from rlfleet.coordinator.service import Coordinator

__all__ = ["Coordinator", "create_app"]

# imported on first use: a process that imports one coordinator module pays for no other
__getattr__ = lazy_exports(__name__, {"Coordinator": "rlfleet.coordinator.service",
                                      "create_app": "rlfleet.coordinator.app"})
