"""Behaviour cloning (`policy.py`), its settings (`config.py`) and its spec, the registry's
entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos.bc.config import BCConfig
from rlfleet.shared.algos.spec import SAMPLED_KINDS, AlgoSpec, Learning

SPEC = AlgoSpec(
    name="bc", title="behaviour cloning", config=BCConfig,
    policy="rlfleet.shared.algos.bc.policy:BehaviourCloning", learning=Learning.OFFLINE,
    action_spaces=frozenset({"discrete", "continuous"}), buffer_kinds=SAMPLED_KINDS,
    capabilities=frozenset({"DataParallel", "SeededActing", "Optimized"}))


def __getattr__(name: str) -> Any:
    """`BehaviourCloning`, imported (with torch) on first use."""
    if name == "BehaviourCloning":
        from rlfleet.shared.algos.bc.policy import BehaviourCloning

        return BehaviourCloning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "BCConfig", "BehaviourCloning"]
