"""R2D2: an LSTM DQN learning from stored sequences (`policy.py`), its settings
(`config.py`) and its spec, the registry's entry."""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos.r2d2.config import R2D2Config
from rlfleet.shared.algos.spec import AlgoSpec, Learning
from rlfleet.shared.contract.spec import EnvSpec


def check(cfg: Any, env: EnvSpec) -> None:
    """An MLP and an LSTM over flat observations; every sequence buffer its batches are
    drawn from (the spec's buffer kinds keep the others out) is longer than the burn-in."""
    if len(env.obs_shape) != 1:
        raise ValueError(f"algo.name='r2d2' supports flat observations only; this env's are "
                         f"{env.obs_shape}")
    if cfg.algo.reward_model is not None:
        raise ValueError("algo.reward_model: a reward model rewrites the rewards of rows of "
                         "transitions; algo.name='r2d2' learns from sequences of them, which "
                         "no reward model reads yet")
    for part in cfg.learner.mix:
        buffer = cfg.buffers.get(part.buffer)
        if buffer is None or buffer.kind != "sequence":
            continue  # the run config names an unknown buffer or a kind that cannot feed it
        if cfg.algo.burn_in >= buffer.sequence_length:
            raise ValueError(f"algo.burn_in={cfg.algo.burn_in} leaves no row of "
                             f"buffers.{part.buffer}.sequence_length="
                             f"{buffer.sequence_length} to learn from")


SPEC = AlgoSpec(
    name="r2d2", title="R2D2", config=R2D2Config,
    policy="rlfleet.shared.algos.r2d2.policy:R2D2", learning=Learning.OFF_POLICY,
    action_spaces=frozenset({"discrete"}), buffer_kinds=frozenset({"sequence"}),
    capabilities=frozenset({"DataParallel", "SeededActing", "Optimized", "Placeable",
                            "MixedPrecision", "EpsilonGreedy", "Recurrent"}),
    check=check)


def __getattr__(name: str) -> Any:
    """`R2D2` and its pieces, imported (with torch) on first use."""
    if name in ("R2D2", "RecurrentQNetwork", "rescale", "unrescale", "n_step_targets"):
        from rlfleet.shared.algos.r2d2 import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "R2D2Config", "R2D2"]
