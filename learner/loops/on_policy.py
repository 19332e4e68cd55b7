"""The on-policy loop: one update per rollout of whole chunks, then a version.

Each round gathers a rollout from the queue buffer (`rlfleet.learner.feed.rollouts`; in a
group, this rank's share of the group's rollout), learns on it once, publishes, and reports
the chunks it consumed, so the data of every round was acted by the last few policy versions
and the queue releases what was used.
"""

from __future__ import annotations

import time

from rlfleet.learner.feed.rollouts import RolloutBatch, RolloutFeeder
from rlfleet.learner.group.member import GroupError
from rlfleet.learner.hooks import BuiltInHook
from rlfleet.learner.loops.base import TrainingLoop
from rlfleet.learner.output.publishing import Publishing
from rlfleet.learner.output.reporting import RoundReporting
from rlfleet.shared.contract.algo import RolloutSettings


class OnPolicyLoop(TrainingLoop):
    def built_ins(self) -> list[BuiltInHook]:
        t = self.t
        return [*super().built_ins(),
                Publishing(t.publisher, t.session, t.timers, every=1, wait=True),
                RoundReporting(t)]

    def run_generation(self) -> bool:
        t = self.t
        feeder = t.progress.feeder = self.open_feeder(t.progress.feeder)
        while not t.ending() and not feeder.stop_run:
            if feeder.broken:
                raise GroupError(feeder.broken)
            if feeder.group_ended or t.session.generation_moved():
                return False
            started = time.perf_counter()
            rollout = self.next_rollout(feeder)
            if not self.wait(started, rollout):
                if feeder.consumed:  # dropped chunks are reported even when no rollout filled
                    t.hooks.after_round()
                continue
            assert rollout is not None
            with t.turns:
                t.hooks.on_data(feeder.take_moments())
                self.update(t.stager.put(rollout.data))  # to the device, frames stacked there
            self.count_round()
            t.progress.learn_rounds += 1
            t.outbox.figures.update({
                "policy_lag_mean": rollout.lag_mean, "policy_lag_max": float(rollout.lag_max),
                "dropped_stale_chunks": float(feeder.dropped_chunks),
                "dropped_stale_rows": float(feeder.dropped_rows),
                "learn_rounds": float(t.progress.learn_rounds)})
            t.hooks.after_round()
        return True

    def open_feeder(self, previous: RolloutFeeder | None) -> RolloutFeeder:
        """This generation's feeder of the run's queue buffer; the chunks the last one
        used and could not report yet go out with this one's first report."""
        t, cfg = self.t, self.t.cfg
        assert t.agent.worker_id is not None  # registered before its first task
        queue = next(p.buffer for p in cfg.learner.mix if cfg.buffers[p.buffer].kind == "queue")
        feeder = RolloutFeeder(
            t.agent.client, t.storage, t.agent.worker_id, queue,
            rollout_size=cfg.rollout_rows,
            max_policy_lag=(cfg.algo.max_policy_lag if isinstance(cfg.algo, RolloutSettings)
                            else None),
            packed=t.placement.cuda)
        if previous is not None:
            feeder.consumed = previous.consumed
        return feeder

    def next_rollout(self, feeder: RolloutFeeder) -> RolloutBatch | None:
        """This learner's rollout (in a group, its share of the group's), or None."""
        t = self.t
        assert t.session.assignment is not None
        if t.session.world_size > 1:
            return feeder.next_share(t.session.assignment.generation, t.publisher.version)
        return feeder.next(t.publisher.version)
