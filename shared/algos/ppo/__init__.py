"""PPO (`policy.py`), its settings (`config.py`) and its spec, the registry's entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.algos.spec import AlgoSpec, Learning
from rlfleet.shared.contract.spec import EnvSpec, is_image


def check(cfg: Any, env: EnvSpec) -> None:
    """Over images, actor and critic share one CNN trunk with a categorical head."""
    if is_image(env.obs_shape) and not env.discrete:
        raise ValueError(f"algo.name='ppo' on image observations {env.obs_shape} supports "
                         "discrete actions only")


SPEC = AlgoSpec(
    name="ppo", title="PPO", config=PPOConfig, policy="rlfleet.shared.algos.ppo.policy:PPO",
    learning=Learning.ON_POLICY, action_spaces=frozenset({"discrete", "continuous"}),
    buffer_kinds=frozenset({"queue"}),
    capabilities=frozenset({"DataParallel", "NormalizesObservations", "Optimized",
                            "Placeable", "MixedPrecision"}),
    check=check)


def __getattr__(name: str) -> Any:
    """`PPO` and its pieces, imported (with torch) on first use."""
    if name in ("PPO", "ActorCritic", "gae"):
        from rlfleet.shared.algos.ppo import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "PPOConfig", "PPO"]
