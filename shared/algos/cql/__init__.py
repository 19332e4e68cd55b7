"""CQL: discrete conservative Q-learning for offline data (`policy.py`), its settings
(`config.py`) and its spec, the registry's entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos import dqn
from rlfleet.shared.algos.cql.config import CQLConfig
from rlfleet.shared.algos.spec import SAMPLED_KINDS, AlgoSpec, Learning

SPEC = AlgoSpec(
    name="cql", title="CQL", config=CQLConfig, policy="rlfleet.shared.algos.cql.policy:CQL",
    learning=Learning.OFFLINE, action_spaces=frozenset({"discrete"}),
    buffer_kinds=SAMPLED_KINDS,
    capabilities=dqn.SPEC.capabilities)


def __getattr__(name: str) -> Any:
    """`CQL`, imported (with torch) on first use."""
    if name == "CQL":
        from rlfleet.shared.algos.cql.policy import CQL

        return CQL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "CQLConfig", "CQL"]
