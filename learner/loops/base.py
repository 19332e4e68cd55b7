"""What every training loop shares: its hooks (the learner's own features, then the user's),
one update with its stages, and the generation's start.

A loop runs inside the learner group's session (`rlfleet.learner.group.session`), which
forms a generation, calls `formed`, then `run_generation` until the generation or the run
ends, and again for the next generation. The learner service runs `after_run` once the
session is over, or as the learner dies of an error.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from rlfleet.learner.feed.obs_stats import ObsStats
from rlfleet.learner.hooks import BuiltInHook
from rlfleet.learner.observe.histograms import Histograms
from rlfleet.learner.output.checkpointing import Checkpointing
from rlfleet.learner.training import Training
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.contract.wire.group import GroupAssignment


class TrainingLoop(ABC):
    def __init__(self, t: Training) -> None:
        self.t = t
        t.hooks.add(*self.built_ins())
        t.hooks.add_user_hooks(t.cfg.learner.hooks)
        self._fed_at = (0.0, 0.0)  # when the data of the round came: perf and thread time

    def built_ins(self) -> list[BuiltInHook]:
        """The learner's own features this loop runs as hooks: those every loop has, and
        those the config turns on; a loop adds its own."""
        t, cfg = self.t, self.t.cfg
        hooks: list[BuiltInHook] = [Checkpointing(
            t.checkpoints, cfg.checkpoint.every_train_iterations, t.session, t.publisher,
            t.timers, t.progress)]
        if cfg.logging.histograms is not None:
            hooks.append(Histograms(cfg.logging.histograms, t.outbox, t.session))
        if ObsStats.wanted(t.policy):
            hooks.append(ObsStats(t.policy))
        return hooks

    @abstractmethod
    def run_generation(self) -> bool:
        """Train until the run ends (True) or the generation does (False)."""

    def formed(self, assignment: GroupAssignment) -> None:
        """A generation was formed: go on from its state (`before_run` the first time)."""
        t = self.t
        t.progress.train_iterations = t.policy.train_iterations
        t.hooks.on_formed(assignment.rank or 0, bool(assignment.publisher))

    def wait(self, started: float, got: object) -> bool:
        """Count a wait for data that began at `started`; whether it brought any."""
        t = self.t
        t1, c1 = time.perf_counter(), time.thread_time()
        t.timers.wait_s += t1 - started
        if got is None:
            t.shortage.waiting()
            return False
        t.shortage.fed()
        self._fed_at = (t1, c1)
        return True

    def count_round(self) -> None:
        """The round's updates, in the timers."""
        self.t.timers.count_update(*self._fed_at)

    def update(self, data: Mapping[str, torch.Tensor], sampled: Batch | None = None,
               weights: torch.Tensor | None = None) -> None:
        """One update and its stages."""
        t = self.t
        t.hooks.before_iter(data, sampled)
        t.gpu.start()
        out = t.policy.learn(data, weights)
        t.gpu.end()
        t.progress.train_iterations = t.policy.train_iterations
        t.hooks.after_iter(out)
