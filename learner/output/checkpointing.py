"""Checkpoints, the built-in hook: only the group's publisher (rank 0) saves them.

One every `checkpoint.every_train_iterations` (0: never but at the end), looked at after each
round of updates, never two at one train iteration; one at the end of the run; and, as the
learner dies of an error, one of what it learned since the last (if the weights are still
finite), so its restart resumes from there. Each holds the policy's state and every hook's
(`HookRunner.state_dict`, JSON in its metadata). A storage outage skips a checkpoint: the
next interval tries again.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

import torch

from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.learner.observe.timers import LearnerTimers
from rlfleet.learner.output.checkpoints import HOOKS_META, CheckpointStore
from rlfleet.learner.output.publisher import Publisher
from rlfleet.shared.infra.storage import StorageError

if TYPE_CHECKING:  # the learner's training module builds this one
    from rlfleet.learner.training import Progress

log = logging.getLogger("rlfleet.learner")


class Checkpointing:
    def __init__(self, store: CheckpointStore, every: int, session: GroupSession,
                 publisher: Publisher, timers: LearnerTimers, progress: Progress) -> None:
        self.store = store
        self.every = every
        self.session = session
        self.publisher = publisher
        self.timers = timers
        self.progress = progress  # its `last_checkpoint`
        self.runner: HookRunner | None = None

    def register(self, runner: HookRunner) -> None:
        self.runner = runner
        runner.register_op("after_round", self._after_round, Order.CHECKPOINT)
        runner.register_op("after_run", self._after_run, Order.CHECKPOINT)

    def _after_round(self, ctx: HookContext) -> None:
        self.save(ctx, force=False)

    def _after_run(self, ctx: HookContext) -> None:
        if ctx.crashed is not None:
            self.on_the_way_down(ctx)
        elif self.session.is_publisher and self.session.assignment is not None:
            self.save(ctx, force=True)

    def save(self, ctx: HookContext, force: bool) -> None:
        """Save one now if `force`, or if one is due; on the publisher only."""
        iterations = ctx.train_iterations
        last = self.progress.last_checkpoint
        periodic = self.every > 0 and iterations - last >= self.every
        if not (force or periodic) or not self.session.is_publisher:
            return
        if iterations == last and last > 0:
            return  # nothing new since the last one
        t0 = time.perf_counter()
        hooks = self.runner.state_dict() if self.runner is not None else {}
        try:
            self.store.save(ctx.policy.state_dict(), iterations, self.publisher.version,
                            {HOOKS_META: json.dumps(hooks)} if hooks else None)
        except StorageError as err:
            log.warning("checkpoint at train iteration %d not saved: %s", iterations, err)
            return
        self.progress.last_checkpoint = iterations
        self.timers.checkpoint_s += time.perf_counter() - t0

    def on_the_way_down(self, ctx: HookContext) -> None:
        """Save what was learned since the last checkpoint; weights that are no longer
        finite are not saved over good ones."""
        if not self.session.is_publisher or self.session.assignment is None:
            return
        if ctx.train_iterations <= self.progress.last_checkpoint:
            return
        state = ctx.policy.state_dict()
        if not all(torch.isfinite(v).all() for v in state.values()
                   if isinstance(v, torch.Tensor) and v.is_floating_point()):
            log.warning("no checkpoint on the way down: the weights are not finite")
            return
        self.save(ctx, force=True)
        log.info("checkpoint saved on the way down at train iteration %d",
                 self.progress.last_checkpoint)
