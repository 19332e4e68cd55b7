"""Publishing policy versions, the built-in hook: only the group's publisher (rank 0) does.

A version goes out each time the group forms (so survivors and newcomers announce where they
continue from), every `every` updates (an off-policy learner also waits at least
`min_interval_s` between two: `learner.publish_min_interval_s`), and once more at the end of
the run. The publish thread writes it (`publisher.py`); `wait` (forming a group, the end, an
on-policy learner's every version) waits until it is in storage, retrying through an outage,
because versions must reach collectors in order.
"""

from __future__ import annotations

import time

from rlfleet.learner.group.member import GroupError
from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.learner.observe.timers import LearnerTimers
from rlfleet.learner.output.publisher import PublishConflict, Publisher


class Publishing:
    def __init__(self, publisher: Publisher, session: GroupSession, timers: LearnerTimers,
                 every: int, min_interval_s: float = 0.0, wait: bool = False) -> None:
        self.publisher = publisher
        self.session = session
        self.timers = timers
        self.every = max(1, every)
        self.min_interval_s = min_interval_s
        self.wait = wait

    def register(self, runner: HookRunner) -> None:
        runner.register_op("on_formed", self._formed, Order.PUBLISH)
        runner.register_op("after_iter", self._after_iter, Order.PUBLISH)
        runner.register_op("after_run", self._after_run, Order.PUBLISH)

    def _formed(self, ctx: HookContext) -> None:
        if self.session.is_publisher:
            self.publish(ctx, wait=True)

    def _after_iter(self, ctx: HookContext) -> None:
        if self.session.is_publisher and ctx.train_iterations % self.every == 0 \
                and self.publisher.due(self.min_interval_s):
            self.publish(ctx, wait=self.wait)

    def _after_run(self, ctx: HookContext) -> None:
        if ctx.crashed is None and self.session.is_publisher \
                and self.session.assignment is not None:
            self.publish(ctx, wait=True)

    def publish(self, ctx: HookContext, wait: bool) -> None:
        """Hand the policy's next version to the publish thread; a version another learner
        took first means this one is not the group's publisher any more."""
        t0 = time.perf_counter()
        try:
            self.publisher.submit(ctx.policy.policy_state(), ctx.train_iterations)
            if wait:
                self.publisher.flush()
        except PublishConflict as err:
            raise GroupError(str(err)) from err
        self.timers.publish_s += time.perf_counter() - t0
