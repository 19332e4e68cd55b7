"""RND: Random Network Distillation as a reward model (`model.py`), its settings
(`config.py`) and its spec, the registry's entry (`algo.reward_model: rnd`)."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos.rnd.config import RNDConfig
from rlfleet.shared.algos.spec import RewardModelSpec

SPEC = RewardModelSpec(name="rnd", config=RNDConfig, model="rlfleet.shared.algos.rnd.model:RND",
                       capabilities=frozenset({"DataParallel", "Optimized"}))


def __getattr__(name: str) -> Any:
    """`RND`, imported (with torch) on first use."""
    if name == "RND":
        from rlfleet.shared.algos.rnd.model import RND

        return RND
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "RNDConfig", "RND"]
