"""APPO and IMPALA on V-trace (`policy.py`, `vtrace.py`), their settings (`config.py`) and
their spec, the registry's entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos import ppo
from rlfleet.shared.algos.appo.config import APPOConfig
from rlfleet.shared.algos.spec import AlgoSpec, Learning
from rlfleet.shared.contract.spec import EnvSpec, is_image


def check(cfg: Any, env: EnvSpec) -> None:
    """PPO's network: over images, one CNN trunk with a categorical head."""
    if is_image(env.obs_shape) and not env.discrete:
        raise ValueError(f"algo.name='appo' on image observations {env.obs_shape} supports "
                         "discrete actions only")


SPEC = AlgoSpec(
    name="appo", title="APPO (V-trace)", config=APPOConfig,
    policy="rlfleet.shared.algos.appo.policy:APPO", learning=Learning.ON_POLICY,
    action_spaces=frozenset({"discrete", "continuous"}), buffer_kinds=frozenset({"queue"}),
    capabilities=ppo.SPEC.capabilities, check=check)


def __getattr__(name: str) -> Any:
    """`APPO`, imported (with torch) on first use."""
    if name == "APPO":
        from rlfleet.shared.algos.appo import policy

        return policy.APPO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "APPOConfig", "APPO"]
