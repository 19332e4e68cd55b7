"""DQN: double DQN with a target network and Huber loss (`policy.py`), its settings
(`config.py`) and its spec, the registry's entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.spec import SAMPLED_KINDS, AlgoSpec, Learning


def warmup(cfg: Any) -> int:
    """At `eps_start` 1, DQN explores with epsilon near 1 with a network no update has
    touched until its buffers hold `min_size` transitions (learning starts there): until
    then, uniform random actions are what it would do, give or take the untrained network's
    few greedy picks. Ape-X collectors (`collector.epsilon_schedule: apex`) act with their
    own fixed epsilons from the first step: no warm-up."""
    if cfg.algo.eps_start < 1.0 or cfg.collector.epsilon_schedule == "apex":
        return 0
    return min(b.rate_limit.min_size for b in cfg.buffers.values())


SPEC = AlgoSpec(
    name="dqn", title="DQN", config=DQNConfig, policy="rlfleet.shared.algos.dqn.policy:DQN",
    learning=Learning.OFF_POLICY, action_spaces=frozenset({"discrete"}),
    buffer_kinds=SAMPLED_KINDS,
    capabilities=frozenset({"DataParallel", "SeededActing", "Optimized", "QValues",
                            "Placeable", "MixedPrecision", "EpsilonGreedy"}),
    warmup=warmup)


def __getattr__(name: str) -> Any:
    """`DQN` and its pieces, imported (with torch) on first use."""
    if name in ("DQN", "QNetwork", "masked_q", "linear_epsilon"):
        from rlfleet.shared.algos.dqn import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "DQNConfig", "DQN"]
