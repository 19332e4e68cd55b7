"""What the learner's two training loops share: one learn task's policy, where its versions,
checkpoints and learn-info go, and the counters other threads read.

The loops themselves (`learner/offpolicy.py`, `learner/onpolicy.py`) only learn and keep
time; `Training` does what both do between updates: hand a version to the publisher, save a
checkpoint when one is due, send learn-info. Only the group's publisher (rank 0) publishes
and saves; every rank reports its own learn-info, which the coordinator merges.

`Progress` holds what the training thread moves on while the agent's thread (heartbeats) and
the web server's (`/status`) read it: plain attributes, written by one thread, so a reader
sees the last value written without a lock in the training loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlfleet.learner.batch_log import BatchLogTaker
from rlfleet.learner.checkpoints import CheckpointStore
from rlfleet.learner.dataproc import DataProcess
from rlfleet.learner.feedback import PriorityFeedback, updates_from
from rlfleet.learner.group import GroupError
from rlfleet.learner.histograms import HistogramTaker
from rlfleet.learner.hooks import HookContext, HookRunner
from rlfleet.learner.metric_window import MetricStats, MetricWindow, WindowReport
from rlfleet.learner.placement import Placement
from rlfleet.learner.prefetch import Prefetcher
from rlfleet.learner.publisher import PublishConflict, Publisher
from rlfleet.learner.reporter import Reporter
from rlfleet.learner.rollouts import RolloutFeeder
from rlfleet.learner.session import GroupSession
from rlfleet.learner.shortage import DataShortage
from rlfleet.learner.staging import GpuClock, Stager
from rlfleet.learner.timers import LearnerTimers
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import Optimized
from rlfleet.shared.algos.device import Precision
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.group import GroupAssignment
from rlfleet.shared.contract.wire.sampling import (
    Consumed,
    HistogramData,
    LearnInfo,
    LearnInfoResponse,
)
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import Storage, StorageError
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerAgent

log = logging.getLogger("rlfleet.learner")


@dataclass(eq=False, slots=True)
class Progress:
    """The learner's counters and its latest sources of data (whose own counters `/status`
    shows), from before the first update to the end of the run."""

    train_iterations: int = 0
    learn_rounds: int = 0  # on-policy: rollouts learned from
    metrics: dict[str, float] = field(default_factory=dict)  # the last report's means
    resumed_from: int | None = None  # the train iteration of the checkpoint restored
    last_checkpoint: int = 0  # the train iteration of the last checkpoint saved or restored
    prefetcher: Prefetcher | DataProcess | None = None  # off-policy: this generation's
    feeder: RolloutFeeder | None = None  # on-policy: this generation's (or the last one's)


def learning_rate(policy: Policy) -> dict[str, float]:
    """The learning rate of an `Optimized` policy, as a metric."""
    if isinstance(policy, Optimized):
        return {"learning_rate": float(policy.optimizer.param_groups[0]["lr"])}
    return {}


@dataclass(eq=False)
class Training:
    """One learn task's training, from its policy's restore to its final report."""

    cfg: RunConfig
    policy: Policy
    storage: Storage
    storage_url: str  # for a data process, which opens storage itself
    seed: int  # the learn task's
    agent: WorkerAgent
    closing: threading.Event
    publisher: Publisher
    session: GroupSession
    timers: LearnerTimers
    progress: Progress
    checkpoints: CheckpointStore
    placement: Placement = field(default_factory=lambda: Placement(
        torch.device("cpu"), Precision()))
    feedback: PriorityFeedback = field(default_factory=PriorityFeedback)
    dataset_scores: dict[str, float] = field(default_factory=dict)  # eval.dataset, unsent
    window: MetricWindow = field(default_factory=MetricWindow)  # updates since the report
    unsent: WindowReport | None = None  # the window, reduced, not yet in a report
    checkpoint_every: int = field(init=False)
    shortage: DataShortage = field(init=False)  # learner.data_shortage_warn_s
    hooks: HookRunner = field(init=False)  # learner.hooks
    histograms: HistogramTaker = field(init=False)  # logging.histograms
    unsent_histograms: dict[str, HistogramData] = field(default_factory=dict)
    batch_log: BatchLogTaker = field(init=False)  # logging.batch_log
    stager: Stager = field(init=False)
    gpu: GpuClock = field(init=False)

    def __post_init__(self) -> None:
        self.checkpoint_every = self.cfg.checkpoint.every_train_iterations
        self.shortage = DataShortage(self.cfg.learner.data_shortage_warn_s)
        self.histograms = HistogramTaker(self.cfg.logging.histograms)
        self.batch_log = BatchLogTaker(self.cfg.logging.batch_log)
        self.hooks = HookRunner.from_config(self.cfg.learner.hooks,
                                            HookContext(self.policy, self.cfg))
        device = self.placement.device
        self.stager = Stager(device, pin=self.cfg.learner.pin_memory)
        self.gpu = GpuClock(device)

    def resume(self) -> None:
        """Continue from the newest checkpoint, if any (a restarted learner or a resumed
        run), and publish after the newest version in storage: versions only ever increase,
        also across learner restarts."""
        restored = self.checkpoints.latest()
        if restored is not None:
            self.policy.load_state_dict(restored[0])
            p = self.progress
            p.resumed_from = p.last_checkpoint = self.policy.train_iterations
            log.info("resumed from checkpoint at train iteration %d", p.resumed_from)
        self.timers.mark(self.policy.train_iterations)
        latest = self.storage.latest_version()
        self.publisher.attach(self.storage, -1 if latest is None else latest)

    def formed(self, assignment: GroupAssignment) -> None:
        """A generation was formed: go on from its state; its publisher announces it."""
        self.progress.train_iterations = self.policy.train_iterations
        self.hooks.ctx.rank = assignment.rank or 0
        self.hooks.ctx.is_publisher = bool(assignment.publisher)
        if assignment.publisher:
            self.publish()

    def finish(self) -> None:
        """The run is over or the learner is closing: the publisher's last version and
        checkpoint, then the last report (with the chunks consumed since the one before)."""
        self.hooks.after_run()
        if self.session.is_publisher and self.session.assignment is not None:
            self.publish()
            self.maybe_checkpoint(force=True)
        feeder = self.progress.feeder
        self.report(feeder.take_consumed() if feeder else None)

    def publish(self, wait: bool = True) -> None:
        """Publish the next version. The publish thread writes it (`learner/publisher.py`);
        `wait` (forming a group, ending) waits until it is in storage, retrying through an
        outage, because versions must reach collectors in order."""
        t0 = time.perf_counter()
        try:
            self.publisher.submit(self.policy.policy_state(), self.policy.train_iterations)
            if wait:
                self.publisher.flush()
        except PublishConflict as err:  # another learner publishes: this one must not
            raise GroupError(str(err)) from err
        self.timers.publish_s += time.perf_counter() - t0

    def maybe_checkpoint(self, force: bool = False) -> None:
        """Save a checkpoint every `checkpoint.every_train_iterations` (0: never but when
        `force`d, as at the end) or now, if `force`, on the publisher only, never twice at
        one train iteration. A storage outage skips it: the next interval tries again."""
        iterations = self.policy.train_iterations
        last = self.progress.last_checkpoint
        periodic = self.checkpoint_every > 0 and iterations - last >= self.checkpoint_every
        if not (force or periodic) or not self.session.is_publisher:
            return
        if iterations == last and last > 0:
            return  # nothing new since the last one
        t0 = time.perf_counter()
        try:
            self.checkpoints.save(self.policy.state_dict(), iterations, self.publisher.version)
        except StorageError as err:
            log.warning("checkpoint at train iteration %d not saved: %s", iterations, err)
            return
        self.progress.last_checkpoint = iterations
        self.timers.checkpoint_s += time.perf_counter() - t0

    def take_metrics(self, extra: Mapping[str, float] | None = None) -> None:
        """Reduce the updates since the last report into the next report's metrics (their
        means become `progress.metrics`); `extra`: figures of the loop's own (a lag, a
        count), one value each."""
        report = self.window.take()
        for key, value in {**learning_rate(self.policy), **(extra or {})}.items():
            report.stats[key] = MetricStats(value, value, value, 1)
        if self.unsent is not None:  # an earlier window that no report carried yet
            report.nonfinite = {k: report.nonfinite.get(k, 0) + self.unsent.nonfinite.get(k, 0)
                                for k in {*report.nonfinite, *self.unsent.nonfinite}}
        if report.stats:
            self.progress.metrics = report.means()
        self.unsent = report

    def _metric_fields(self) -> dict[str, Any]:
        """The unsent window's fields of a LearnInfo; each window goes out once, so the
        coordinator never weighs one update's loss twice."""
        report, self.unsent = self.unsent, None
        histograms, self.unsent_histograms = self.unsent_histograms, {}
        logged = self.batch_log.take_pending()
        if report is None:
            return {"histograms": histograms, "batch_log": logged}
        stats = report.stats
        return {"metrics": {k: v.mean for k, v in stats.items()},
                "metric_counts": {k: v.count for k, v in stats.items()},
                "metrics_min": {k: v.min for k, v in stats.items()},
                "metrics_max": {k: v.max for k, v in stats.items()},
                "arrays": report.arrays, "nonfinite": report.nonfinite,
                "histograms": histograms, "batch_log": logged}

    def maybe_histograms(self, batch: Mapping[str, torch.Tensor]) -> None:
        """`logging.histograms`, right after an update on `batch`, when due (publisher
        only: every rank's networks are the same)."""
        if self.session.is_publisher and self.histograms.due(self.policy.train_iterations):
            self.unsent_histograms = self.histograms.take(self.policy, batch)

    def checkpoint_on_the_way_down(self) -> None:
        """The learner dies of an exception: save what it learned since the last checkpoint
        (up to `checkpoint.every_train_iterations` updates) if it still can, so its restart
        resumes from here. Weights that are no longer finite are not saved over good ones."""
        if not self.session.is_publisher or self.session.assignment is None:
            return
        if self.policy.train_iterations <= self.progress.last_checkpoint:
            return
        try:
            state = self.policy.state_dict()
            if not all(torch.isfinite(v).all() for v in state.values()
                       if isinstance(v, torch.Tensor) and v.is_floating_point()):
                log.warning("no checkpoint on the way down: the weights are not finite")
                return
            self.maybe_checkpoint(force=True)
        except Exception:  # the original error is the one to report
            log.exception("no checkpoint on the way down")
            return
        log.info("checkpoint saved on the way down at train iteration %d",
                 self.progress.last_checkpoint)

    def timers_ms(self) -> dict[str, float]:
        """ms per train iteration since the last report, by phase."""
        feed = self.progress.prefetcher
        gpu = None
        if self.gpu.enabled:
            self.gpu.collect()
            gpu = {"gpu_busy": self.gpu.busy_s, "gpu_wait": self.gpu.wait_s}
        return self.timers.per_iteration(self.policy.train_iterations,
                                         feed.fetch_s if feed else 0.0,
                                         self.session.allreduce_seconds(), gpu)

    def report(self, consumed: list[Consumed] | None = None) -> bool:
        """Send learn-info from this thread; True when the coordinator says the run is over.
        Consumed chunk ids that could not be delivered go back to the feeder for the next
        report."""
        consumed = consumed or []
        try:
            resp = self.agent.client.post(f"{API}/learn-info", LearnInfo(
                worker_id=self.agent.worker_id, train_iterations=self.policy.train_iterations,
                policy_version=self.publisher.version, **self._metric_fields(),
                priorities=self.feedback.take(), consumed=consumed,
                timers=self.timers_ms()), LearnInfoResponse)
        except HttpError as err:
            # Priorities are soft state: a lost update only leaves older priorities in place.
            log.warning("learn-info not delivered: %s", err)
            feeder = self.progress.feeder
            if consumed and feeder is not None:
                feeder.give_back(consumed)
            return False
        if resp.best_policy_version is not None:
            self.checkpoints.mark_best(resp.best_policy_version)
        return resp.stop

    def learn_info(self) -> Callable[[], LearnInfo]:
        """A report for the `Reporter`'s thread: the snapshot is taken here, on the training
        thread; the body is built there."""
        worker_id, iterations, version = (self.agent.worker_id, self.policy.train_iterations,
                                          self.publisher.version)
        metrics, priorities, timers = self._metric_fields(), \
            self.feedback.take_arrays(), self.timers_ms()
        scores, self.dataset_scores = self.dataset_scores, {}
        return lambda: LearnInfo(worker_id=worker_id, train_iterations=iterations,
                                 policy_version=version, **metrics,
                                 priorities=updates_from(priorities), consumed=[],
                                 timers=timers, dataset_eval=scores)

    def mark_best(self, reporter: Reporter) -> None:
        """Protect the checkpoint of the best-evaluated version the reporter heard of."""
        best = reporter.best_policy_version
        if best is not None:
            reporter.best_policy_version = None
            self.checkpoints.mark_best(best)
