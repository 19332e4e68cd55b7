"""The coordinator: membership, tasks, the replay (buffers and rate limits) and the run's state.

Routes (`coordinator/routes.py`) are thin: they validate a body and call one method here.
`Coordinator` is the glue, the request handlers, around parts that each own one concern:
`CoordinatorState` (`state.py`: the run's counters, the lock that guards them and the
replay, and the snapshot format), `Membership`, `TaskTable`, `Replay`, `RunLog`, the
`TaskDispatcher` (`dispatcher.py`: pushes tasks to workers), the `EvaluationSchedule`
(`evaluation.py`), `Durability` (`durability.py`: the journal, snapshots, restore and the
janitor), the `LearnerGroup` (`learner_group.py`: generations of the data-parallel learner
group and the shards its ranks learn from) and the `Readout` (`readout.py`: what `/status`,
the run log and Prometheus show).

Its own *scheduler* thread reaps silent workers, hands the tasks of dead workers on (a main
task waits, unassigned, for the next worker of its role; queue chunks a dead learner held go
back to the queue), starts evaluations when due, checks stop rules, and gives durability its
turn to snapshot and collect garbage. It blocks on an event with a timeout; it never spins.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from rlfleet.coordinator.admission import WorkerNetworks, check_device
from rlfleet.coordinator.batch_log import BatchLog
from rlfleet.coordinator.dispatcher import TaskDispatcher
from rlfleet.coordinator.durability import Durability
from rlfleet.coordinator.env_settings import EnvSettings
from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.health import RunHealth
from rlfleet.coordinator.learner_group import LearnerGroup, StaleGeneration
from rlfleet.coordinator.liveness import Liveness, probe
from rlfleet.coordinator.membership import Membership, UnknownWorker, Worker, WorkerIdTaken
from rlfleet.coordinator.readout import Readout
from rlfleet.coordinator.runlog import RunLog
from rlfleet.coordinator.sampling import SampleGrant
from rlfleet.coordinator.snapshot import SnapshotParts
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.tasks import TaskRecord, TaskTable, UnknownTask
from rlfleet.shared.contract.commander import load_commander
from rlfleet.shared.contract.wire.base import Role, TaskKind, TaskState
from rlfleet.shared.contract.wire.control import RunState
from rlfleet.shared.contract.wire.evaluation import EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.experience import (
    ChunkMeta,
    ChunkReport,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
)
from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.contract.wire.membership import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)
from rlfleet.shared.contract.wire.sampling import (
    Consumed,
    LearnInfo,
    LearnInfoResponse,
    SampleRequest,
)
from rlfleet.shared.contract.wire.status import Status
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask, LearnTask
from rlfleet.shared.contract.wire.views import BufferCleared, BufferLoaded, BufferLoadRequest
from rlfleet.shared.infra.auth import load_token
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.infra.storage.credentials import redact
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay, UnknownBuffer
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.telemetry.rotating import MB

log = logging.getLogger("rlfleet.coordinator")

CONSUMED_EVENT = "consumed"  # the journal's record of queue chunks a learner used up
CLEARED_EVENT = "buffer_cleared"  # ... of a buffer emptied by request
LOADED_EVENT = "buffer_loaded"  # ... of chunks loaded into one buffer by request


class WrongWorker(ValueError):
    """A worker acting on a task that belongs to another worker."""


class RateLimited(Exception):
    """Nothing may be sampled now; try again after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited: retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


class Coordinator:
    """The request handlers and the scheduler, over the parts.

    The parts are built in dependency order, each before anything that refers to it; a
    resumed run (`resume=True`) is then restored into the whole, or starts fresh when
    storage has no snapshot, and only then is the run log opened, at the step the run
    continues from."""

    def __init__(self, cfg: RunConfig, storage_url: str, run_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic, resume: bool = False) -> None:
        # Whatever the coordinator shows or hands out names storage without its password
        # (workers find it themselves: shared/infra/storage/credentials.py).
        if cfg.storage and redact(cfg.storage) != cfg.storage:
            cfg = cfg.with_overrides(storage=redact(cfg.storage))
        self.cfg = cfg
        self.storage_url = redact(storage_url)
        token = load_token()  # before anything is opened: a misconfigured token fails here
        self.run_dir = Path(run_dir) if run_dir else None
        self.storage = open_storage(storage_url, cfg.name)  # the password, if any, stays here
        self.clock = clock
        started_at = clock()
        # The counters, and the lock that guards them and the replay and orders sampling
        # against inserts; first, so the parts that stop the run get its `stop`.
        self.state = CoordinatorState(clock, started_at=started_at)
        self.members = Membership(cfg.coordinator.heartbeat_timeout_s, clock)
        self.admission = WorkerNetworks(cfg.coordinator.worker_networks)
        self.tasks = TaskTable(cfg.collector)  # Ape-X slots on collect tasks, if asked
        # logging.batch_log: every sample handed out counted, per-sample values written
        self.batch_log = BatchLog(cfg.logging.batch_log, self.run_dir)
        self.replay = Replay(cfg, self.storage,
                             self.batch_log if self.batch_log.active else None)
        self.group = LearnerGroup(cfg, clock)
        self.dispatcher = TaskDispatcher(cfg, self.members, self.tasks, token)
        # The run's commander (`coordinator.commander`): env settings of tasks.
        self.env_settings = EnvSettings(load_commander(cfg), self.state.stop)
        self.runlog = RunLog(cfg, self.run_dir, open_logger=False)  # opened by `_restore`
        self.health = RunHealth(cfg.learner.data_shortage_warn_s)  # alerts in /status
        max_mb = cfg.logging.episodes_max_mb
        self.episode_table = EpisodeTable(
            cfg.name, self.run_dir if cfg.logging.episodes else None,
            None if max_mb is None else max(1, int(max_mb * MB)))
        # self-play: the league, its opponents and snapshots (None: a single-agent run)
        self.matchmaker = (Matchmaker(cfg, self.storage, self.run_dir)
                           if cfg.league is not None else None)
        self.eval_schedule = EvaluationSchedule(
            cfg, self.tasks, self.members, self.storage, self.run_dir, self.dispatcher.push,
            battles=self.matchmaker.eval_opponents if self.matchmaker else None,
            solves=self.matchmaker.solved if self.matchmaker else None,
            show_video=self.runlog.on_video,
            env_kwargs=self.env_settings.evaluate_kwargs, score=self.env_settings.score)
        snapshots = SnapshotParts(self.state, self.replay, self.tasks, self.eval_schedule,
                                  self.matchmaker, self.env_settings)
        self.durability = Durability(cfg, self.storage, self.storage_url, self.state,
                                     self.replay, snapshots, accept=self._accept,
                                     on_event=self._replay_event)
        self.readout = Readout(cfg, self.storage_url, self.state, replay=self.replay,
                               members=self.members, tasks=self.tasks, group=self.group,
                               evaluations=self.eval_schedule, matchmaker=self.matchmaker,
                               durability=self.durability, health=self.health)
        self._closing = threading.Event()
        self._wake = threading.Event()  # an early scheduler tick
        self._scheduler = threading.Thread(target=self._scheduler_loop, name="scheduler",
                                           daemon=True)
        self._started = False
        self._restore(resume)

    def _restore(self, resume: bool) -> None:
        """Continue the run from storage (`resume`: its newest snapshot and the journals
        after it), or start it fresh, discarding whatever an older run journalled; then
        open the run log where the run continues."""
        resumed = self.durability.restore() if resume else None
        if resumed is None:
            self.durability.discard_journals()
        elif resumed.snapshot is not None:  # the curriculum goes on at the level it reached
            self.env_settings.load_state(resumed.snapshot.commander)
        self.runlog.open(self.state.env_steps if resumed is not None else None)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Coordinator:
        if not self._started:
            self._started = True
            self._scheduler.start()
            self.dispatcher.start()
            self.durability.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        self.dispatcher.stop()
        with self.state.cond:
            self.state.cond.notify_all()
        if self._started:
            self._scheduler.join(timeout=5)
            self.dispatcher.join(timeout=5)
        self.durability.close()  # after the scheduler: no snapshot may follow the final one
        if self.matchmaker is not None:
            self.matchmaker.write_view(self.clock(), final=True)
        self.runlog.close()
        self.episode_table.close()
        self._flush_batch_log()
        self.batch_log.close()
        self.storage.close()

    @property
    def stopped(self) -> bool:
        return self.state.stopped

    def stop(self, reason: str) -> None:
        self.state.stop(reason)

    # -- membership -------------------------------------------------------------------------

    def register(self, req: RegisterRequest) -> RegisterResponse:
        self.admission.check(req.url)  # NotAdmitted: 403, nothing registered
        if req.role is Role.LEARNER:  # DeviceMissing: 409, nothing registered
            check_device(self.cfg.learner.device, "learner.device", req)
        else:
            check_device(self.cfg.collector.device, "collector.device", req)
        try:
            worker, is_new = self.members.register(req.role, req.url, req.worker_id,
                                                   req.resources, self._gone_holder(req))
        except WorkerIdTaken as err:  # 409: the newcomer fails, the holder goes on
            log.warning("refused a %s at %s: %s", req.role.value, req.url, err)
            raise
        log.info("%s %s at %s", "registered" if is_new else "re-registered",
                 worker.worker_id, worker.url)
        if not is_new:  # a restart under the same id: its old process's work is lost
            self._requeue_held(worker.worker_id, "registered again")
            self._leave_group(worker.worker_id, "registered again")
            for rec in self.tasks.active_for(worker.worker_id):
                if rec.kind is TaskKind.EVALUATE:  # the new process never got it
                    self.dispatcher.push(rec)
        if not self.stopped:
            self._assign_main_task(worker)
        return RegisterResponse(
            worker_id=worker.worker_id, run_name=self.cfg.name, storage=self.storage_url,
            config=self.cfg.model_dump(mode="json"),
            heartbeat_interval_s=self.cfg.coordinator.heartbeat_interval_s,
            env_steps=self.state.env_steps)

    def _gone_holder(self, req: RegisterRequest) -> str | None:
        """The URL of the live-looking holder of the id the request names, if nothing
        answers there any more: a worker restarted on another port (as `rlfleet up` restarts
        one) while its old entry was within the heartbeat timeout. One that answers, or is
        only silent (hung: the heartbeat timeout decides), keeps its id."""
        holder = self.members.holder(req.worker_id, req.url)
        if holder is None or probe(holder.url) is not Liveness.GONE:
            return None
        log.info("%s registers from %s; nothing answers at its old URL %s: a restart",
                 holder.worker_id, req.url, holder.url)
        return holder.url

    def heartbeat(self, worker_id: str, req: HeartbeatRequest) -> HeartbeatResponse:
        worker = self.members.heartbeat(worker_id, req.status, req.url)
        return HeartbeatResponse(stop=self.stopped, paused=self.state.paused,
                                 policy_version=self.state.version_or_none(),
                                 env_steps=self.state.env_steps,
                                 group_generation=(self.group.generation if worker.role
                                                   is Role.LEARNER else None))

    def leave(self, worker_id: str) -> Worker:
        worker = self.members.leave(worker_id)
        self._requeue_held(worker_id, "left")
        self._leave_group(worker_id, "left")
        for rec in self.tasks.active_for(worker_id):
            self.tasks.end(rec.task_id, TaskState.FINISHED)
        log.info("worker %s left", worker_id)
        return worker

    def _requeue_held(self, worker_id: str, why: str) -> None:
        with self.state.cond:
            n = self.replay.requeue_held_by(worker_id)
            if n:
                self.state.cond.notify_all()
        if n:
            log.warning("%s %s: %d queued chunks it held go back to the queue", worker_id,
                        why, n)

    def _worker_gone(self, worker: Worker, why: str) -> None:
        """A worker died: its learner chunks go back to the queue, its main task waits for
        the next worker of its role, its evaluation goes to another collector."""
        self._requeue_held(worker.worker_id, why)
        self._leave_group(worker.worker_id, "died")
        for rec in self.tasks.active_for(worker.worker_id):
            if rec.kind is TaskKind.EVALUATE:
                self.eval_schedule.reassign(rec, why)
            else:
                self.tasks.unassign(rec.task_id, why)
                log.warning("task %s of %s is unassigned: %s", rec.task_id, worker.worker_id,
                            why)
        self._offer_unassigned()

    def _leave_group(self, worker_id: str, why: str) -> None:
        """A learner that is gone: the group re-forms without it (chunks its generation's
        rollouts held go back to the queue)."""
        with self.state.cond:
            if self.group.remove(worker_id, why, self.replay):
                self.state.cond.notify_all()

    def group_sync(self, req: GroupSyncRequest) -> GroupAssignment:
        """A learner's place in the current generation of the learner group. A rank whose
        collective failed says so (`broken`); the ranks that do not answer `/health` then are
        left out at once (a killed or hung learner), rather than after its heartbeats time
        out, which would make the next rendezvous wait for it."""
        worker = self.members.touch(req.worker_id)
        if worker.role is not Role.LEARNER:
            raise StaleGeneration(f"worker {req.worker_id!r} is a {worker.role.value}, not a "
                                  "learner", "worker_id")
        silent = []
        if req.broken and req.generation == self.group.generation:
            silent = [w for w in list(self.group.ranks)
                      if w != req.worker_id and not self._answers(w)]
        with self.state.cond:
            for w in silent:
                self.group.remove(w, "unresponsive", self.replay)
            assignment = self.group.sync(req, self.replay)
            self.state.cond.notify_all()  # samplers of an ended generation stop waiting
        return assignment

    def _answers(self, worker_id: str) -> bool:
        """Whether a worker's own HTTP service answers `/health` within a second."""
        try:
            url = self.members.get(worker_id).url
        except UnknownWorker:
            return False
        return probe(url) is Liveness.ANSWERS

    def _offer_unassigned(self) -> None:
        """Hand unassigned main tasks to live workers of their role that have none."""
        if self.stopped:
            return
        for worker in self.members.alive():
            kind = TaskKind.COLLECT if worker.role is Role.COLLECTOR else TaskKind.LEARN
            if any(r.kind is kind for r in self.tasks.active_for(worker.worker_id)):
                continue
            rec = self.tasks.claim(worker.worker_id, kind)
            if rec is not None:
                log.info("task %s reassigned to %s", rec.task_id, worker.worker_id)
                self.env_settings.refresh(rec, self.tasks)  # the commander's settings now
                self._log_slot(rec)
                self.dispatcher.push(rec)

    # -- tasks ------------------------------------------------------------------------------

    def _assign_main_task(self, worker: Worker) -> TaskRecord:
        """The worker's own task if it had one (it restarted, or this coordinator did), an
        unassigned one of its role, or a new one."""
        kind = TaskKind.COLLECT if worker.role is Role.COLLECTOR else TaskKind.LEARN
        rec = self.tasks.claim(worker.worker_id, kind)
        if rec is not None:
            self.env_settings.refresh(rec, self.tasks)  # the commander's settings now
            self._log_slot(rec)
            self.dispatcher.push(rec)
            return rec
        seed = self.cfg.seed * 100_003 + zlib.crc32(worker.worker_id.encode()) % 100_000
        if worker.role is Role.COLLECTOR:
            task = CollectTask(task_id=self.tasks.new_id(TaskKind.COLLECT), seed=seed,
                               opponents=(self.matchmaker.opponents(2 * self.cfg.env.num_envs)
                                          if self.matchmaker else []))
            task = self.env_settings.collect_task(task, worker.worker_id)
        else:
            task = LearnTask(task_id=self.tasks.new_id(TaskKind.LEARN), seed=self.cfg.seed)
        rec = self.tasks.add(task, worker.worker_id)
        self._log_slot(rec)
        self.dispatcher.push(rec)
        return rec

    def _log_slot(self, rec: TaskRecord) -> None:
        """Say which Ape-X slot (and epsilon) a collect task was handed out with."""
        task = rec.task
        if isinstance(task, CollectTask) and task.apex_slot is not None:
            slots = self.cfg.collector.apex_slots
            log.info("%s: %s has Ape-X slot %d of %d, epsilon %.6g", rec.worker_id,
                     rec.task_id, task.apex_slot, slots, task.epsilon)
            collecting = len(self.tasks.active(TaskKind.COLLECT))
            if collecting > slots:
                log.warning("%d collect tasks for collector.apex_slots=%d: collectors share "
                            "slots (and epsilons)", collecting, slots)

    def end_task(self, task_id: str, worker_id: str | None, error: str | None) -> TaskRecord:
        rec = self.tasks.get(task_id)
        if worker_id is not None and rec.worker_id != worker_id:
            raise WrongWorker(f"task '{task_id}' belongs to worker '{rec.worker_id}', "
                              f"not '{worker_id}'")
        state = TaskState.FAILED if error else TaskState.FINISHED
        if error:
            log.warning("task %s failed on %s: %s", task_id, rec.worker_id, error)
        ended = self.tasks.end(task_id, state, error)
        if error and rec.kind is TaskKind.EVALUATE:  # its weights would never be reported
            self.eval_schedule.forget_evaluated(task_id)
        return ended

    def _check_task(self, task_id: str, worker_id: str, kind: TaskKind) -> TaskRecord:
        rec = self.tasks.get(task_id)
        if rec.worker_id != worker_id:
            raise WrongWorker(f"task '{task_id}' belongs to worker '{rec.worker_id}', "
                              f"not '{worker_id}'")
        if rec.kind is not kind:
            raise WrongWorker(f"task '{task_id}' is a {rec.kind.value} task, not {kind.value}")
        return rec

    # -- experience -------------------------------------------------------------------------

    def report_chunks(self, req: ChunkReport) -> ChunkReportResponse:
        """Journal, then index, then acknowledge: once the answer leaves, a coordinator
        crash cannot lose the chunks (a `StorageError` from the journal answers 503 and
        changes nothing; the collector keeps the report and sends it again)."""
        self.members.touch(req.worker_id)
        self._check_task(req.task_id, req.worker_id, TaskKind.COLLECT)
        with self.durability.journalled(req.worker_id, req.chunks) as fresh:
            fresh, dead = self._accept(fresh, req.worker_id)
            # A paused run throttles collectors the same way a lagging learner does:
            # they finish the chunk at hand, report it, and wait for a permit.
            throttle = self.state.paused or self.replay.inserts_blocked()
            self.state.cond.notify_all()
            env_steps, version = self.state.env_steps, self.state.policy_version
        if dead:
            self.durability.release(dead)
        if fresh:
            self.runlog.on_chunks(fresh, env_steps, self.rates()[0], version)
            self.episode_table.on_chunks(req.worker_id, req.task_id,
                                         self._task_seed(req.task_id), fresh, env_steps,
                                         time.time())
        if self.eval_schedule.due(self.state.env_steps, self.state.train_iterations):
            self._wake.set()
        # self-play: as many new opponents as games reported (a retried report too: its
        # collector has played those games and needs the next ones)
        opponents = (self.matchmaker.opponents(Matchmaker.games_in(req.chunks))
                     if self.matchmaker else [])
        return ChunkReportResponse(accepted=len(fresh), env_steps=env_steps,
                                   throttle_s=0.05 if throttle else 0.0, stop=self.stopped,
                                   opponents=opponents)

    def _task_seed(self, task_id: str) -> int | None:
        try:
            return getattr(self.tasks.get(task_id).task, "seed", None)
        except UnknownTask:  # forgotten meanwhile (only the newest ended tasks are kept)
            return None

    def _replay_event(self, event: dict) -> list[str]:
        """A journalled change that is not a chunk report, replayed by a restore (with the
        state's lock held): a consumption of queue chunks, or a league change. Returns the
        ids of the chunks it released."""
        if event.get("kind") == CONSUMED_EVENT:
            consumed = [Consumed.model_validate(c) for c in event["consumed"]]
            return self.replay.consume(consumed, replaying=True)
        if event.get("kind") in (CLEARED_EVENT, LOADED_EVENT) and \
                event["buffer"] not in self.replay.buffers:
            log.warning("journal: buffer %s is not in the config any more: its %s is "
                        "skipped", event["buffer"], event["kind"])
            return []
        if event.get("kind") == CLEARED_EVENT:
            return self.replay.clear(event["buffer"])[2]
        if event.get("kind") == LOADED_EVENT:
            return self._load(event["buffer"], [ChunkMeta.model_validate(c)
                                                for c in event["chunks"]],
                              event.get("priorities"))
        if self.matchmaker is not None:
            self.matchmaker.apply(event)
        return []

    def _accept(self, metas: list[ChunkMeta], worker_id: str
                ) -> tuple[list[ChunkMeta], list[str]]:
        """Index journalled chunks and count them (under the state's lock); (fresh, dead
        ids)."""
        fresh, dead = self.replay.insert(metas, self.state.train_iterations)
        self.state.count_chunks(fresh)
        if self.matchmaker is not None:
            self.matchmaker.on_chunks(fresh)
        self.members.count_chunks(worker_id, len(fresh))
        return fresh, dead

    def collect_permit(self, req: CollectPermitRequest) -> CollectPermitResponse:
        self.members.touch(req.worker_id)
        deadline = self.clock() + req.wait_s
        with self.state.cond:
            while (not self.stopped and not self._closing.is_set()
                   and (self.state.paused or self.replay.inserts_blocked())):
                left = deadline - self.clock()
                if left <= 0:
                    return CollectPermitResponse(granted=False, stop=False)
                self.state.cond.wait(left)
        return CollectPermitResponse(granted=not self.stopped, stop=self.stopped)

    def sample(self, req: SampleRequest) -> SampleGrant:
        """Batches for a learner, or its rank's shard of the group's (`group_generation`).
        Raises `RateLimited` when nothing could be granted within `wait_s`."""
        self.members.touch(req.worker_id)
        if req.group_generation is not None:
            return self._sample_group(req)
        plan = self.replay.plan(req)
        deadline = self.clock() + req.wait_s
        state = self.state
        dead: list[str] = []
        with state.cond:
            while True:
                count = self.replay.grantable(plan, req.num_batches)
                if count > 0 or state.stopped or self._closing.is_set():
                    break
                left = deadline - self.clock()
                if left <= 0:
                    raise RateLimited(0.05)
                state.cond.wait(left)
            if count <= 0:
                return SampleGrant.now(state, None, [], [], 0)
            chunk_ids, parts, dead = self.replay.sample(plan, count, state.train_iterations,
                                                        state.policy_version, req.worker_id)
            state.granted_batches += count
            state.cond.notify_all()  # collectors waiting for the learner may go on
            grant = SampleGrant.now(state, None, chunk_ids, parts, count)
        if dead:
            self.durability.release(dead)
        return grant

    def _sample_group(self, req: SampleRequest) -> SampleGrant:
        """This rank's shard of the group batches (or rollout) starting at `group_cursor`:
        sampled once for the whole group, at the global batch size, by whichever rank asks
        first; the others get their shards of the same batches."""
        assert req.group_generation is not None and req.group_cursor is not None
        plan = self.replay.plan(req)
        queue = self.replay.queue_buffer(plan)
        deadline = self.clock() + req.wait_s
        dead: list[str] = []
        state = self.state
        with state.cond:
            while True:
                rank = self.group.rank_of(req.worker_id, req.group_generation)
                entry = self.group.cached(rank, req.group_cursor)
                if entry is not None or state.stopped or self._closing.is_set():
                    break
                if queue is not None:
                    entry, released = self.group.form_rollout(
                        self.replay, queue, self.cfg.rollout_rows, state.train_iterations,
                        state.policy_version)
                    dead += released
                    if entry is not None:
                        state.granted_batches += 1
                        break
                elif not self.group.backlog_full():
                    self.group.check_plan(plan)
                    count = self.replay.grantable(plan, req.num_batches)
                    if count > 0:
                        ids, parts, released = self.replay.sample(
                            plan, count, state.train_iterations, state.policy_version)
                        dead += released
                        entry = self.group.add_batches(ids, parts, count)
                        state.granted_batches += count
                        state.cond.notify_all()
                        break
                left = deadline - self.clock()
                if left <= 0:
                    break
                state.cond.wait(left)
            if entry is not None:
                chunk_ids, parts = entry.shards[rank]
                grant = SampleGrant.now(state, self.group, chunk_ids, parts, entry.count,
                                        entry.first_seq)
            elif state.stopped or self._closing.is_set():
                grant = SampleGrant.now(state, self.group, [], [], 0, req.group_cursor)
            else:
                grant = None
        if dead:
            self.durability.release(dead)
        if grant is None:
            raise RateLimited(0.05)
        return grant

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
            self.durability.journal_event(
                {"kind": CONSUMED_EVENT,
                 "consumed": [c.model_dump(mode="json") for c in req.consumed]}, apply)
        else:
            with self.state.cond:
                apply()
        if dead:
            self.durability.release(dead)
        self.health.on_learn_info(req.worker_id, req.train_iterations, req.nonfinite)
        self.runlog.on_learn_info(req, self.state.env_steps, self.rates()[1],
                                  self.health.nonfinite_total)
        self.batch_log.on_learn_info(req, self.state.env_steps)
        self._wake.set()
        return LearnInfoResponse(stop=self.stopped,
                                 best_policy_version=self.eval_schedule.best_policy_version)

    # -- run control ------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> RunState:
        with self.state.cond:
            self.state.paused = paused
            self.state.cond.notify_all()  # waiting permits re-check
        log.info("collection %s by request", "paused" if paused else "resumed")
        return self.run_state()

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

        self.durability.journal_event({"kind": CLEARED_EVENT, "buffer": name}, apply)
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
            dead.extend(self._load(name, req.chunks, req.priorities))
            accepted = self.state.chunks_accepted - before
            self.state.cond.notify_all()

        self.durability.journal_event(
            {"kind": LOADED_EVENT, "buffer": name,
             "chunks": [c.model_dump(mode="json") for c in req.chunks],
             "priorities": req.priorities}, apply)
        self.durability.release(dead)
        with self.state.cond:
            size = len(self.replay.buffers[name])
        log.info("buffer %s: %d chunks loaded by request", name, accepted)
        return BufferLoaded(name=name, accepted=accepted, items=size)

    def _load(self, name: str, metas: list[ChunkMeta],
              priorities: list[list[float]] | None) -> list[str]:
        """Index loaded chunks and count them as acknowledged (under the state's lock);
        returns the chunk ids to delete."""
        fresh, dead = self.replay.load_into(name, metas, self.state.train_iterations,
                                            priorities)
        self.state.chunks_accepted += len(fresh)
        return dead

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
        self._check_task(req.task_id, req.worker_id, TaskKind.EVALUATE)
        seed = self._task_seed(req.task_id)
        state = self.state
        evaluated = self.tasks.get(req.task_id).task  # the env settings it ran with
        env_kwargs = dict(evaluated.env_kwargs) if isinstance(evaluated, EvaluateTask) else {}
        result = self.eval_schedule.report(req, state.env_steps, state.train_iterations,
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

    # -- background threads -----------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        """A tick every half second at most, and one as a silent worker's heartbeat timeout
        passes: a learner group waits for a frozen rank until it is declared dead."""
        interval = min(self.cfg.coordinator.heartbeat_interval_s, 0.5)
        while not self._closing.is_set():
            expiry = self.members.next_expiry()
            until_expiry = interval if expiry is None else expiry - self.clock() + 0.005
            self._wake.wait(min(interval, max(until_expiry, 0.005)))
            self._wake.clear()
            try:
                self._tick()
            except Exception:  # the scheduler must outlive a bug in one tick; it is logged
                log.exception("scheduler tick failed")

    def _flush_batch_log(self) -> None:
        """Sample counts to samples.jsonl (the batch log's own locks: none of the run's)."""
        if self.batch_log.active:
            self.batch_log.write_samples(self.batch_log.take_rows())

    def _tick(self) -> None:
        now = self.clock()
        for worker in self.members.reap():
            log.warning("worker %s missed heartbeats for %.1fs: marked dead", worker.worker_id,
                        self.members.timeout_s)
            self._worker_gone(worker, "worker died")
        if self.tasks.any_unassigned():
            self._offer_unassigned()
        self.eval_schedule.expire(now)
        self.readout.sample_rates(now)
        self.batch_log.count_queued()  # the samples handed out since the last tick
        if self.batch_log.flush_due(time.monotonic()):
            self._flush_batch_log()
        state, stop = self.state, self.cfg.stop
        if stop.max_env_steps is not None and state.env_steps >= stop.max_env_steps:
            self.stop(f"max_env_steps={stop.max_env_steps} reached")
        if stop.max_train_iterations is not None and \
                state.train_iterations >= stop.max_train_iterations:
            self.stop(f"max_train_iterations={stop.max_train_iterations} reached")
        if stop.max_wall_s is not None and now - state.started_at >= stop.max_wall_s:
            self.stop(f"max_wall_s={stop.max_wall_s} reached")
        if not state.stopped:
            self.eval_schedule.maybe_start(state.policy_version, state.env_steps,
                                           state.train_iterations)
        if self.matchmaker is not None:
            if not state.stopped:
                self.matchmaker.maybe_snapshot(state.policy_version,
                                               self.durability.journal_event)
            self.matchmaker.write_view(now)
        self.runlog.on_tick(state.env_steps, {**self.readout.info_scalars(),
                                              **self.env_settings.scalars()})
        self.durability.tick(now)

    # -- reading state ----------------------------------------------------------------------

    def rates(self) -> tuple[float, float]:
        return self.readout.rates()

    def status(self) -> Status:
        return self.readout.status()


__all__ = ["Coordinator", "RateLimited", "StaleGeneration", "UnknownBuffer", "UnknownTask",
           "UnknownWorker", "WrongWorker"]
