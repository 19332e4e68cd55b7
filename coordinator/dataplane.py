"""The coordinator's data plane: what collectors report and learners take and give back.

Experience itself never passes through here (it is in storage); what does is its
bookkeeping. A collector's chunk report is journalled, then indexed, then acknowledged, and
a collector asks for a permit before its next chunk when the run is paused or the learner
lags (the rate limits). A learner samples (`sampling.py`) and reports its progress, its
priorities and the queue chunks it used up (`learn_info`). An operator clears a buffer or
loads chunks into one. Every change to the replay is journalled before it is made and made
through the `Intake`, as a restore replays it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rlfleet.coordinator.batch_log import BatchLog
from rlfleet.coordinator.durability import Durability
from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.health import RunHealth
from rlfleet.coordinator.intake import Intake, cleared_event, consumed_event, loaded_event
from rlfleet.coordinator.learner_group import LearnerGroup
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.readout import Readout
from rlfleet.coordinator.runlog import RunLog
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.workers import Workers
from rlfleet.shared.contract.wire.base import TaskKind
from rlfleet.shared.contract.wire.experience import (
    ChunkReport,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
)
from rlfleet.shared.contract.wire.sampling import LearnInfo, LearnInfoResponse
from rlfleet.shared.contract.wire.views import BufferCleared, BufferLoaded, BufferLoadRequest
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay

log = logging.getLogger("rlfleet.coordinator")


class DataPlane:
    """`wake_scheduler`: asks the scheduler for an early tick (an evaluation fell due, a
    learner made progress that may meet a stop rule)."""

    def __init__(self, clock: Callable[[], float], state: CoordinatorState, *,
                 members: Membership, workers: Workers, replay: Replay, group: LearnerGroup,
                 intake: Intake, durability: Durability, evaluations: EvaluationSchedule,
                 matchmaker: Matchmaker | None, readout: Readout, runlog: RunLog,
                 episode_table: EpisodeTable, batch_log: BatchLog, health: RunHealth,
                 wake_scheduler: Callable[[], None]) -> None:
        self.clock = clock
        self.state = state
        self.members = members
        self.workers = workers  # whose task a report is for, and its seed
        self.replay = replay
        self.group = group
        self.intake = intake
        self.durability = durability
        self.evaluations = evaluations
        self.matchmaker = matchmaker
        self.readout = readout
        self.runlog = runlog
        self.episode_table = episode_table
        self.batch_log = batch_log
        self.health = health
        self.wake_scheduler = wake_scheduler

    # -- collectors -------------------------------------------------------------------------

    def report_chunks(self, req: ChunkReport) -> ChunkReportResponse:
        """Journal, then index, then acknowledge: once the answer leaves, a coordinator
        crash cannot lose the chunks (a `StorageError` from the journal answers 503 and
        changes nothing; the collector keeps the report and sends it again)."""
        self.members.touch(req.worker_id)
        self.workers.check_task(req.task_id, req.worker_id, TaskKind.COLLECT)
        with self.durability.journalled(req.worker_id, req.chunks) as fresh:
            fresh, dead = self.intake.accept(fresh, req.worker_id)
            # A paused run throttles collectors the same way a lagging learner does:
            # they finish the chunk at hand, report it, and wait for a permit.
            throttle = self.state.paused or self.replay.inserts_blocked()
            self.state.cond.notify_all()
            env_steps, version = self.state.env_steps, self.state.policy_version
        if dead:
            self.durability.release(dead)
        if fresh:
            self.runlog.on_chunks(fresh, env_steps, self.readout.rates()[0], version)
            self.episode_table.on_chunks(req.worker_id, req.task_id,
                                         self.workers.task_seed(req.task_id), fresh, env_steps,
                                         time.time())
        if self.evaluations.due(self.state.env_steps, self.state.train_iterations):
            self.wake_scheduler()
        # self-play: as many new opponents as games reported (a retried report too: its
        # collector has played those games and needs the next ones)
        opponents = (self.matchmaker.opponents(Matchmaker.games_in(req.chunks))
                     if self.matchmaker else [])
        return ChunkReportResponse(accepted=len(fresh), env_steps=env_steps,
                                   throttle_s=0.05 if throttle else 0.0, stop=self.state.stopped,
                                   opponents=opponents)

    def collect_permit(self, req: CollectPermitRequest) -> CollectPermitResponse:
        self.members.touch(req.worker_id)
        deadline = self.clock() + req.wait_s
        with self.state.cond:
            while (not self.state.stopped and not self.state.closing.is_set()
                   and (self.state.paused or self.replay.inserts_blocked())):
                left = deadline - self.clock()
                if left <= 0:
                    return CollectPermitResponse(granted=False, stop=False)
                self.state.cond.wait(left)
        return CollectPermitResponse(granted=not self.state.stopped, stop=self.state.stopped)

    # -- learners ---------------------------------------------------------------------------

    def learn_info(self, req: LearnInfo) -> LearnInfoResponse:
        self.members.touch(req.worker_id)
        with self.state.cond:
            self.replay.check_feedback(req.priorities, req.consumed)
        dead: list[str] = []
        state = self.state

        def apply() -> None:  # with the state's lock held
            nonlocal dead
            state.train_iterations = max(state.train_iterations, req.train_iterations)
            state.policy_version = max(state.policy_version, req.policy_version)
            # losses and the like averaged over the ranks of the group
            state.learner_metrics = self.group.on_learn_info(
                req.worker_id, req.train_iterations, dict(req.metrics), dict(req.timers))
            self.replay.update_priorities(req.priorities)
            dead = self.replay.consume(req.consumed)
            state.cond.notify_all()

        if req.consumed:
            # On-policy data is used once, across a crash too: the consumption goes into the
            # journal before it is made (a StorageError: 503, the learner reports it again).
            self.durability.journal_event(consumed_event(req.consumed), apply)
        else:
            with self.state.cond:
                apply()
        if dead:
            self.durability.release(dead)
        self.health.on_learn_info(req.worker_id, req.train_iterations, req.nonfinite)
        self.runlog.on_learn_info(req, self.state.env_steps, self.readout.rates()[1],
                                  self.health.nonfinite_total)
        self.batch_log.on_learn_info(req, self.state.env_steps)
        self.wake_scheduler()
        return LearnInfoResponse(stop=self.state.stopped,
                                 best_policy_version=self.evaluations.best_policy_version)

    # -- operators --------------------------------------------------------------------------

    def clear_buffer(self, name: str) -> BufferCleared:
        """Empty a buffer (`Replay.clear`), journalled first so a restarted coordinator
        replays the clear; its chunks no buffer holds go to deletion as evicted ones do."""
        with self.state.cond:
            self.replay.writable(name)  # 404/409 before anything is journalled
        cleared: tuple[int, int, list[str]] = (0, 0, [])

        def apply() -> None:  # with the state's lock held
            nonlocal cleared
            cleared = self.replay.clear(name)
            self.state.cond.notify_all()

        self.durability.journal_event(cleared_event(name), apply)
        items, chunks, dead = cleared
        self.durability.release(dead)
        log.info("buffer %s cleared by request: %d items, %d chunks", name, items, chunks)
        return BufferCleared(name=name, items=items, chunks=chunks)

    def load_buffer(self, name: str, req: BufferLoadRequest) -> BufferLoaded:
        """Index chunks a client wrote to storage in one buffer (`rlfleet buffer load`),
        journalled first like a collector's report. They count as acknowledged chunks (the
        ledger), not as env steps of this run."""
        with self.state.cond:
            self.replay.check_load(name, req.chunks, req.priorities)
        accepted = 0
        dead: list[str] = []

        def apply() -> None:  # with the state's lock held
            nonlocal accepted
            before = self.state.chunks_accepted
            dead.extend(self.intake.load(name, req.chunks, req.priorities))
            accepted = self.state.chunks_accepted - before
            self.state.cond.notify_all()

        self.durability.journal_event(loaded_event(name, req.chunks, req.priorities),
                                      apply)
        self.durability.release(dead)
        with self.state.cond:
            size = len(self.replay.buffers[name])
        log.info("buffer %s: %d chunks loaded by request", name, accepted)
        return BufferLoaded(name=name, accepted=accepted, items=size)
