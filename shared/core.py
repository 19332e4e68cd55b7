"""The role interfaces, in the spirit of Acme's core.py: what a collector and a learner need
from each other, with no transport in sight.

The algorithm side is `shared.algos.base.Policy`. A collector's loop, spelt with these
names::

    source = WeightSource(...); policy = make_policy(cfg.algo, spec, seed)
    while running:
        if (new := source.poll(policy.version)) is not None:
            policy.load_policy(*new)
        chunk = rollout.collect(env_step)        # policy.act on every vector step
        adder.add(chunk.arrays, ...)             # storage write, then metadata report
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class Adder(Protocol):
    """How a collector hands experience over: write the chunk, then announce it."""

    def add(self, arrays: Mapping[str, np.ndarray], policy_version: int,
            episode_returns: list[float], episode_lengths: list[int],
            segments: list[tuple[int, int]] | None = None,
            timers: dict[str, float] | None = None,
            episode_return_components: list[list[float]] | None = None) -> str:
        """Store one chunk and queue its metadata; returns the chunk id."""

    def flush(self) -> None:
        """Announce everything stored so far (before a drain or shutdown)."""


@runtime_checkable
class WeightSource(Protocol):
    """Where a collector gets policy weights from."""

    def poll(self, current_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """A newer (version, state) than `current_version`, or None."""
