"""Run control: stopping, pausing and scaling the run, evaluations reported, and the
scheduler.

The *scheduler* thread reaps silent workers, hands the tasks of dead workers on (`Workers`),
starts evaluations when due, checks the stop rules, and gives durability its turn to
snapshot and collect garbage. It blocks on an event with a timeout, and wakes early when
asked (`wake`: an evaluation fell due, a learner made progress); it never spins.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rlfleet.coordinator.batch_log import BatchLog
from rlfleet.coordinator.dispatcher import TaskDispatcher
from rlfleet.coordinator.durability import Durability
from rlfleet.coordinator.env_settings import EnvSettings
from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.learner_group import LearnerGroup
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.readout import Readout
from rlfleet.coordinator.runlog import RunLog
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.tasks import TaskTable
from rlfleet.coordinator.workers import Workers
from rlfleet.shared.contract.wire.base import Role, TaskKind
from rlfleet.shared.contract.wire.control import RunState
from rlfleet.shared.contract.wire.evaluation import EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.tasks import EvaluateTask
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")


class RunControl:
    def __init__(self, cfg: RunConfig, clock: Callable[[], float], state: CoordinatorState, *,
                 members: Membership, workers: Workers, tasks: TaskTable, replay: Replay,
                 group: LearnerGroup, dispatcher: TaskDispatcher, env_settings: EnvSettings,
                 evaluations: EvaluationSchedule, matchmaker: Matchmaker | None,
                 durability: Durability, readout: Readout, runlog: RunLog,
                 episode_table: EpisodeTable, batch_log: BatchLog) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state = state
        self.members = members
        self.workers = workers
        self.tasks = tasks
        self.replay = replay
        self.group = group
        self.dispatcher = dispatcher
        self.env_settings = env_settings
        self.evaluations = evaluations
        self.matchmaker = matchmaker
        self.durability = durability
        self.readout = readout
        self.runlog = runlog
        self.episode_table = episode_table
        self.batch_log = batch_log
        self._wake = threading.Event()  # an early scheduler tick
        self._scheduler = threading.Thread(target=self._scheduler_loop, name="scheduler",
                                           daemon=True)

    # -- the scheduler's thread -------------------------------------------------------------

    def start(self) -> None:
        self._scheduler.start()

    def wake(self) -> None:
        """A scheduler tick now, not at the next interval."""
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Wait for the scheduler's thread to end (after `state.close()`), if it started."""
        self._wake.set()
        if self._scheduler.is_alive():
            self._scheduler.join(timeout=timeout)

    # -- the run ----------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        self.state.stop(reason)

    def set_paused(self, paused: bool) -> RunState:
        with self.state.cond:
            self.state.paused = paused
            self.state.cond.notify_all()  # waiting permits re-check
        log.info("collection %s by request", "paused" if paused else "resumed")
        return self.run_state()

    def scale(self, collectors: int | None, learners: int | None = None) -> RunState:
        """Record how many collectors and learners the run should have; the learner group
        is sized to `learners` at once (the launcher or the orchestrator starts or stops the
        processes)."""
        if collectors is not None:
            self.state.collectors_desired = collectors
            log.info("collectors wanted: %d", collectors)
        if learners is not None:
            with self.state.cond:
                self.group.resize(learners, self.replay)
                self.state.cond.notify_all()
            log.info("learners wanted: %d", learners)
        return self.run_state()

    def run_state(self) -> RunState:
        s = self.state
        return RunState(state=s.phase, paused=s.paused, stop_reason=s.stop_reason,
                        collectors_desired=s.collectors_desired,
                        collectors_alive=len(self.members.alive(Role.COLLECTOR)),
                        learners_desired=self.group.learners_desired,
                        learners_alive=len(self.members.alive(Role.LEARNER)))

    # -- evaluation -------------------------------------------------------------------------

    def report_evaluation(self, req: EvaluationReport) -> EvaluationResult:
        self.members.touch(req.worker_id)
        self.workers.check_task(req.task_id, req.worker_id, TaskKind.EVALUATE)
        seed = self.workers.task_seed(req.task_id)
        state = self.state
        evaluated = self.tasks.get(req.task_id).task  # the env settings it ran with
        env_kwargs = dict(evaluated.env_kwargs) if isinstance(evaluated, EvaluateTask) else {}
        result = self.evaluations.report(req, state.env_steps, state.train_iterations,
                                         self.clock() - state.started_at,
                                         self.runlog.on_evaluation, env_kwargs)
        self.episode_table.on_evaluation(req, seed, result.env_steps, time.time())
        for rec in self.env_settings.on_evaluation(result, env_kwargs, self.tasks):
            self.dispatcher.push(rec)  # the same collect task, with new env settings
        if why := self.env_settings.solved():
            self.state.stop(why, solved=True)
        stop_value = self.cfg.eval.stop_value
        if stop_value is not None and result.return_mean >= stop_value:
            self.state.stop(f"solved: evaluation return {result.return_mean:.1f} >= "
                            f"{stop_value}", solved=True)
        why = self.matchmaker.solved(result) if self.matchmaker else None
        if why:
            self.state.stop(why, solved=True)
        return result

    # -- the scheduler ----------------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        """A tick every half second at most, and one as a silent worker's heartbeat timeout
        passes: a learner group waits for a frozen rank until it is declared dead."""
        interval = min(self.cfg.coordinator.heartbeat_interval_s, 0.5)
        while not self.state.closing.is_set():
            expiry = self.members.next_expiry()
            until_expiry = interval if expiry is None else expiry - self.clock() + 0.005
            self._wake.wait(min(interval, max(until_expiry, 0.005)))
            self._wake.clear()
            try:
                self._tick()
            except Exception:  # the scheduler must outlive a bug in one tick; it is logged
                log.exception("scheduler tick failed")

    def flush_batch_log(self) -> None:
        """Sample counts to samples.jsonl (the batch log's own locks: none of the run's)."""
        if self.batch_log.active:
            self.batch_log.write_samples(self.batch_log.take_rows())

    def _tick(self) -> None:
        now = self.clock()
        self.workers.reap()
        self.evaluations.expire(now)
        self.readout.sample_rates(now)
        self.batch_log.count_queued()  # the samples handed out since the last tick
        if self.batch_log.flush_due(time.monotonic()):
            self.flush_batch_log()
        self._check_stop_rules(now)
        state = self.state
        if not state.stopped:
            self.evaluations.maybe_start(state.policy_version, state.env_steps,
                                         state.train_iterations)
        if self.matchmaker is not None:
            if not state.stopped:
                self.matchmaker.maybe_snapshot(state.policy_version,
                                               self.durability.journal_event)
            self.matchmaker.write_view(now)
        self.runlog.on_tick(state.env_steps, {**self.readout.info_scalars(),
                                              **self.env_settings.scalars()})
        self.durability.tick(now)

    def _check_stop_rules(self, now: float) -> None:
        """The config's budgets (`stop:`): env steps, train iterations, wall time."""
        state, stop = self.state, self.cfg.stop
        if stop.max_env_steps is not None and state.env_steps >= stop.max_env_steps:
            self.stop(f"max_env_steps={stop.max_env_steps} reached")
        if stop.max_train_iterations is not None and \
                state.train_iterations >= stop.max_train_iterations:
            self.stop(f"max_train_iterations={stop.max_train_iterations} reached")
        if stop.max_wall_s is not None and now - state.started_at >= stop.max_wall_s:
            self.stop(f"max_wall_s={stop.max_wall_s} reached")
