"""The learner: training loops that host the learner's features and the user's as hooks,
its data feeds, the learner group, and what it sends out, as a worker service
(`LearnerService`) whose Flask app is `shared.worker`'s.

What starts a learner (the `rlfleet learner` command, the single-process runner) imports its
service from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.shared.util.imports import lazy_exports

if TYPE_CHECKING:
    from rlfleet.learner.service import LearnerService

__all__ = ["LearnerService"]

# imported on first use: it imports torch
__getattr__ = lazy_exports(__name__, {"LearnerService": "rlfleet.learner.service"})
