"""The collector: the collect loop over a rollout, evaluation episodes and policy refresh,
as a worker service (`CollectorService`) whose Flask app is `shared.worker`'s.

What starts a collector (the `rlfleet collector` command, the single-process runner)
imports its service from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.collector.service import CollectorService

__all__ = ["CollectorService"]


def __getattr__(name: str) -> Any:
    """Imported on first use (a collector's start leaves torch for later)."""
    if name != "CollectorService":
        raise AttributeError(f"module 'rlfleet.collector' has no attribute {name!r}")
    return vars(importlib.import_module("rlfleet.collector.service"))[name]
