"""What a learn task's training is made of: its policy, where its versions, checkpoints and
reports go, its hooks, and the counters other threads read. The loops
(`rlfleet.learner.loops`) learn and keep time; the built-in hooks that the loops' stages
call do everything else, each with the parts here it needs.

`Progress` holds what the training thread moves on while the agent's thread (heartbeats) and
the web server's (`/status`) read it: plain attributes, written by one thread, so a reader
sees the last value written without a lock in the training loop.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from rlfleet.learner.feed.base import Feed
from rlfleet.learner.feed.rollouts import RolloutFeeder
from rlfleet.learner.feed.staging import GpuClock, Stager
from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.hooks import HookContext, HookRunner
from rlfleet.learner.observe.batch_log import BatchLogTaker
from rlfleet.learner.observe.metric_window import MetricWindow
from rlfleet.learner.observe.shortage import DataShortage
from rlfleet.learner.observe.timers import LearnerTimers
from rlfleet.learner.output.checkpoints import HOOKS_META, CheckpointStore
from rlfleet.learner.output.feedback import PriorityFeedback
from rlfleet.learner.output.publisher import Publisher
from rlfleet.learner.placement import Placement
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.device import Precision
from rlfleet.shared.contract.wire.sampling import HistogramData
from rlfleet.shared.infra.storage import Storage
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import ALONE, Turns, WorkerAgent

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
    prefetcher: Feed | None = None  # off-policy: this generation's feed
    feeder: RolloutFeeder | None = None  # on-policy: this generation's (or the last one's)


@dataclass(eq=False)
class Outbox:
    """What the next learn-info report carries beside the metrics, filled by the hooks that
    make it (priorities, histograms, batch-log rows, dataset scores) and emptied by the
    one that reports."""

    priorities: PriorityFeedback = field(default_factory=PriorityFeedback)
    histograms: dict[str, HistogramData] = field(default_factory=dict)
    batch_log: BatchLogTaker = field(default_factory=lambda: BatchLogTaker(None))
    dataset_eval: dict[str, float] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)  # the loop's own, one value each


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
    window: MetricWindow = field(default_factory=MetricWindow)  # updates since the report
    outbox: Outbox = field(default_factory=Outbox)
    run_over: threading.Event = field(default_factory=threading.Event)  # the coordinator said
    turns: Turns = ALONE  # shared with a collector of this process: one turn a round
    shortage: DataShortage = field(init=False)  # learner.data_shortage_warn_s
    hooks: HookRunner = field(init=False)
    stager: Stager = field(init=False)
    gpu: GpuClock = field(init=False)

    def __post_init__(self) -> None:
        self.shortage = DataShortage(self.cfg.learner.data_shortage_warn_s)
        self.hooks = HookRunner(HookContext(self.policy, self.cfg))
        device = self.placement.device
        self.stager = Stager(device, pin=self.cfg.learner.pin_memory)
        self.gpu = GpuClock(device)

    @property
    def ctx(self) -> HookContext:
        return self.hooks.ctx

    def ending(self) -> bool:
        """The learner is closing, or the coordinator said the run is over."""
        return self.closing.is_set() or self.run_over.is_set()

    def resume(self) -> None:
        """Continue from the newest checkpoint, if any (a restarted learner or a resumed
        run): the policy's state and the hooks'; and publish after the newest version in
        storage. Call it once every hook is added."""
        restored = self.checkpoints.latest()
        if restored is not None:
            state, meta = restored
            self.policy.load_state_dict(state)
            self.hooks.load_state_dict(_hook_states(meta))
            p = self.progress
            p.resumed_from = p.last_checkpoint = self.policy.train_iterations
            log.info("resumed from checkpoint at train iteration %d", p.resumed_from)
        self.timers.mark(self.policy.train_iterations)
        self.progress.train_iterations = self.policy.train_iterations
        # versions only ever increase, across learner restarts too
        latest = self.storage.latest_version()
        self.publisher.attach(self.storage, -1 if latest is None else latest)

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


def _hook_states(meta: dict[str, str]) -> dict[str, Any]:
    """The hooks' states a checkpoint's metadata holds (none in one from before hooks had
    state, or one whose entry cannot be read: logged)."""
    raw = meta.get(HOOKS_META)
    if raw is None:
        return {}
    try:
        states = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("the checkpoint's hook states are not JSON: the hooks start afresh")
        return {}
    return states if isinstance(states, dict) else {}
