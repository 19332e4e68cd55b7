"""The learner: training loops that host the learner's features and the user's as hooks,
its data feeds, the learner group, and what it sends out, as a worker service
(`LearnerService`) whose Flask app is `shared.worker`'s.

What starts a learner (the `rlfleet learner` command, the single-process runner) imports its
service from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.learner.service import LearnerService

__all__ = ["LearnerService"]


def __getattr__(name: str) -> Any:
    """Imported on first use (it imports torch)."""
    if name != "LearnerService":
        raise AttributeError(f"module 'rlfleet.learner' has no attribute {name!r}")
    return vars(importlib.import_module("rlfleet.learner.service"))[name]
