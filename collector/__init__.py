"""The collector: the collect loop over a rollout, evaluation episodes and policy refresh,
as a worker service (`CollectorService`) whose Flask app is `shared.worker`'s.

What starts a collector (the `rlfleet collector` command, the single-process runner)
imports its service from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.shared.util.imports import lazy_exports

if TYPE_CHECKING:
    from rlfleet.collector.service import CollectorService

__all__ = ["CollectorService"]

# imported on first use: a collector's start leaves torch for later
__getattr__ = lazy_exports(__name__, {"CollectorService": "rlfleet.collector.service"})
