"""Learn-info reports, the built-in hook: every rank reports its own, which the coordinator
merges.

A report carries the updates' metrics since the last one (each window goes out once, so
the coordinator never weighs one update's loss twice) with what the other hooks put in the
outbox (new priorities, histograms, batch-log rows, dataset scores), the timers, and, from an
on-policy learner, the chunks it used up. The coordinator's answer says whether the run is
over (`Training.run_over`) and which version evaluated best (its checkpoint is kept).

- `IntervalReporting` (off-policy and offline): the update loop runs thousands of updates a
  second, so it only snapshots a report every `learner.learn_info_interval_s`; a thread of
  its own sends it (`reporter.py`).
- `RoundReporting` (on-policy): one report after each rollout, sent from the training thread,
  with the chunks the rollout used: a report that fails gives them back to the feeder for
  the next one, since queue chunks must be acknowledged exactly once.

Both send a last report at the end of the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.learner.observe.metric_window import MetricStats, WindowReport
from rlfleet.learner.output.feedback import updates_from
from rlfleet.learner.output.reporter import Reporter
from rlfleet.learner.training import Training
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import Optimized
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.sampling import Consumed, LearnInfo, LearnInfoResponse
from rlfleet.shared.infra.http import HttpError

log = logging.getLogger("rlfleet.learner")


def learning_rate(policy: Policy) -> dict[str, float]:
    """The learning rate of an `Optimized` policy, as a metric."""
    if isinstance(policy, Optimized):
        return {"learning_rate": float(policy.optimizer.param_groups[0]["lr"])}
    return {}


class Reports:
    """What both reporting hooks share: the metrics window reduced into a report's fields,
    and the report built from the training's parts."""

    def __init__(self, t: Training) -> None:
        self.t = t
        self.unsent: WindowReport | None = None  # a reduced window no report carried yet

    def add(self, ctx: HookContext) -> None:
        """The update's metrics, with what every hook added, into the window."""
        self.t.window.add(ctx.metrics)

    def take_metrics(self, extra: Mapping[str, float] | None = None) -> None:
        """Reduce the updates since the last report into the next report's metrics (their
        means become `progress.metrics`); `extra`: figures of the loop's own."""
        t = self.t
        report = t.window.take()
        figures = {**learning_rate(t.policy), **t.outbox.figures, **(extra or {})}
        t.outbox.figures = {}
        for key, value in figures.items():
            report.stats[key] = MetricStats(value, value, value, 1)
        if self.unsent is not None:  # an earlier window that no report carried yet
            report.nonfinite = {k: report.nonfinite.get(k, 0) + self.unsent.nonfinite.get(k, 0)
                                for k in {*report.nonfinite, *self.unsent.nonfinite}}
        if report.stats:
            t.progress.metrics = report.means()
        self.unsent = report

    def fields(self) -> dict[str, Any]:
        """The unsent window's fields of a LearnInfo and the outbox's, handed over once."""
        outbox = self.t.outbox
        report, self.unsent = self.unsent, None
        histograms, outbox.histograms = outbox.histograms, {}
        scores, outbox.dataset_eval = outbox.dataset_eval, {}
        out: dict[str, Any] = {"histograms": histograms,
                               "batch_log": outbox.batch_log.take_pending(),
                               "dataset_eval": scores}
        if report is not None:
            stats = report.stats
            out.update(metrics={k: v.mean for k, v in stats.items()},
                       metric_counts={k: v.count for k, v in stats.items()},
                       metrics_min={k: v.min for k, v in stats.items()},
                       metrics_max={k: v.max for k, v in stats.items()},
                       arrays=report.arrays, nonfinite=report.nonfinite)
        return out

    def snapshot(self, consumed: list[Consumed] | None = None) -> Callable[[], LearnInfo]:
        """A report, snapshot here on the training thread, its body built where it is
        called (the reporter's thread turns the priority arrays into the request)."""
        t = self.t
        worker_id, iterations = t.agent.worker_id, t.policy.train_iterations
        version, fields = t.publisher.version, self.fields()
        priorities, timers = t.outbox.priorities.take_arrays(), t.timers_ms()
        return lambda: LearnInfo(worker_id=worker_id, train_iterations=iterations,
                                 policy_version=version, **fields,
                                 priorities=updates_from(priorities),
                                 consumed=consumed or [], timers=timers)

    def answered(self, resp: LearnInfoResponse) -> None:
        if resp.best_policy_version is not None:
            self.t.checkpoints.mark_best(resp.best_policy_version)
        if resp.stop:
            self.t.run_over.set()

    def send_now(self, consumed: list[Consumed] | None = None) -> bool:
        """Send a report from this thread; whether it was delivered. Consumed chunk ids
        that could not be delivered go back to the feeder for the next report."""
        t = self.t
        try:
            resp = t.agent.client.post(f"{API}/learn-info", self.snapshot(consumed)(),
                                       LearnInfoResponse)
        except HttpError as err:
            # Priorities are soft state: a lost update only leaves older priorities in place.
            log.warning("learn-info not delivered: %s", err)
            feeder = t.progress.feeder
            if consumed and feeder is not None:
                feeder.give_back(consumed)
            return False
        self.answered(resp)
        return True


class IntervalReporting:
    """Off-policy and offline: a report handed to the reporter's thread when one is due."""

    def __init__(self, t: Training, interval_s: float) -> None:
        self.reports = Reports(t)
        self.interval_s = interval_s
        self.reporter: Reporter | None = None

    def register(self, runner: HookRunner) -> None:
        runner.register_op("before_run", self._start, Order.REPORT)
        runner.register_op("after_iter", self._after_iter, Order.REPORT)
        runner.register_op("after_round", self._after_round, Order.REPORT)
        runner.register_op("after_run", self._after_run, Order.REPORT)

    def _start(self, ctx: HookContext) -> None:
        t = self.reports.t
        self.reporter = Reporter(t.agent.client, t.run_over)

    def _after_iter(self, ctx: HookContext) -> None:
        self.reports.add(ctx)
        # Within a sample answer too: with a large network one answer is seconds of
        # updates, and progress (and priorities) should not wait for its end.
        if self.reporter is not None and self.reporter.due(self.interval_s):
            self.reports.take_metrics()
            self.reporter.send(self.reports.snapshot())

    def _after_round(self, ctx: HookContext) -> None:
        self._mark_best()

    def _mark_best(self) -> None:
        """Keep the checkpoint of the best-evaluated version the reporter heard of (here,
        on the training thread, which owns the checkpoints)."""
        reporter = self.reporter
        if reporter is not None and reporter.best_policy_version is not None:
            best, reporter.best_policy_version = reporter.best_policy_version, None
            self.reports.t.checkpoints.mark_best(best)

    def _after_run(self, ctx: HookContext) -> None:
        if self.reporter is not None:
            self.reporter.close()  # what it still holds goes out before the last report
            self._mark_best()
        if ctx.crashed is None:
            self.reports.take_metrics()
            self.reports.send_now()


class RoundReporting:
    """On-policy: a report after each rollout, with the chunks it used up."""

    def __init__(self, t: Training) -> None:
        self.reports = Reports(t)

    def register(self, runner: HookRunner) -> None:
        runner.register_op("after_iter", self.reports.add, Order.REPORT)
        runner.register_op("after_round", self._after_round, Order.REPORT)
        runner.register_op("after_run", self._after_run, Order.REPORT)

    def _consumed(self) -> list[Consumed]:
        feeder = self.reports.t.progress.feeder
        return feeder.take_consumed() if feeder is not None else []

    def _after_round(self, ctx: HookContext) -> None:
        self.reports.take_metrics()
        self.reports.send_now(self._consumed())

    def _after_run(self, ctx: HookContext) -> None:
        if ctx.crashed is None:
            self.reports.send_now(self._consumed())
