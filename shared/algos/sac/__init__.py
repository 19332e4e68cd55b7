"""SAC: Soft Actor-Critic for continuous actions (`policy.py`), its settings (`config.py`) and
its spec, the registry's entry."""

from __future__ import annotations

import math
from typing import Any

from rlfleet.shared.algos.sac.config import SACConfig
from rlfleet.shared.algos.spec import SAMPLED_KINDS, AlgoSpec, Learning
from rlfleet.shared.contract.spec import EnvSpec, is_image


def check(cfg: Any, env: EnvSpec) -> None:
    """SAC's networks are MLPs over flat observations, and its tanh-squashed actions are
    scaled to the action space's bounds, so both must be finite."""
    env_id = getattr(getattr(cfg, "env", None), "id", None)
    where = f"env.id={env_id!r}" if env_id is not None else "the env"
    if is_image(env.obs_shape):
        raise ValueError(f"{where} gives image observations {tuple(env.obs_shape)}: "
                         "algo.name='sac' has MLP networks over flat observations only")
    bounds = (*env.action_low, *env.action_high)
    if not bounds or not all(math.isfinite(b) for b in bounds):
        raise ValueError(f"{where} has an unbounded action space (low {env.action_low}, high "
                         f"{env.action_high}): algo.name='sac' squashes its actions into the "
                         "bounds, so they must be finite")


def warmup(cfg: Any) -> int:
    """SAC acts uniformly at random in the action space for the run's first
    `algo.random_steps` env steps (`act` does so too), so collectors may act so before
    torch has loaded."""
    return int(cfg.algo.random_steps)


SPEC = AlgoSpec(
    name="sac", title="SAC", config=SACConfig, policy="rlfleet.shared.algos.sac.policy:SAC",
    learning=Learning.OFF_POLICY, action_spaces=frozenset({"continuous"}),
    buffer_kinds=SAMPLED_KINDS,
    capabilities=frozenset({"DataParallel", "NormalizesObservations", "SeededActing",
                            "Optimized", "Placeable", "MixedPrecision"}),
    check=check, warmup=warmup)


def __getattr__(name: str) -> Any:
    """`SAC` and its pieces, imported (with torch) on first use."""
    if name in ("SAC", "Actor", "TwinQ", "squash", "squashed_log_prob"):
        from rlfleet.shared.algos.sac import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "SACConfig", "SAC"]
