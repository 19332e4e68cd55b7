"""The coordinator's workers: who joins, beats, leaves or dies, the tasks they are handed,
and the learner group they form.

A worker registers (admitted by its URL and its devices), is handed its main task (its own
again after a restart, else an unassigned one of its role, else a new one), heartbeats, and
leaves or falls silent. A dead worker's main task waits, unassigned, for the next worker of
its role; its evaluation moves to another collector; queue chunks it held go back to the
queue; a learner's going re-forms the learner group. `Workers` changes membership, the task
table and the group; what it pushes to workers goes through the `TaskDispatcher`.
"""

from __future__ import annotations

import logging
import zlib

from rlfleet.coordinator.admission import WorkerNetworks, check_device
from rlfleet.coordinator.dispatcher import TaskDispatcher
from rlfleet.coordinator.env_settings import EnvSettings
from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.learner_group import LearnerGroup, StaleGeneration
from rlfleet.coordinator.liveness import Liveness, probe
from rlfleet.coordinator.membership import Membership, UnknownWorker, Worker, WorkerIdTaken
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.tasks import TaskRecord, TaskTable, UnknownTask
from rlfleet.shared.contract.wire.base import Role, TaskKind, TaskState
from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.contract.wire.membership import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)
from rlfleet.shared.contract.wire.tasks import CollectTask, LearnTask
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")


class WrongWorker(ValueError):
    """A worker acting on a task that belongs to another worker."""


class Workers:
    """Membership, tasks and the learner group's membership, under the run's state."""

    def __init__(self, cfg: RunConfig, storage_url: str, state: CoordinatorState, *,
                 members: Membership, admission: WorkerNetworks, tasks: TaskTable,
                 replay: Replay, group: LearnerGroup, dispatcher: TaskDispatcher,
                 env_settings: EnvSettings, evaluations: EvaluationSchedule,
                 matchmaker: Matchmaker | None) -> None:
        self.cfg = cfg
        self.storage_url = storage_url  # without its password: what workers are told
        self.state = state
        self.members = members
        self.admission = admission
        self.tasks = tasks
        self.replay = replay
        self.group = group
        self.dispatcher = dispatcher
        self.env_settings = env_settings
        self.evaluations = evaluations
        self.matchmaker = matchmaker

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
        if not self.state.stopped:
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
        return HeartbeatResponse(stop=self.state.stopped, paused=self.state.paused,
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

    def reap(self) -> None:
        """The scheduler's turn: workers silent past the heartbeat timeout are dead, and
        their main tasks (and any others unassigned) go to live workers."""
        for worker in self.members.reap():
            log.warning("worker %s missed heartbeats for %.1fs: marked dead", worker.worker_id,
                        self.members.timeout_s)
            self._worker_gone(worker, "worker died")
        if self.tasks.any_unassigned():
            self.offer_unassigned()

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
                self.evaluations.reassign(rec, why)
            else:
                self.tasks.unassign(rec.task_id, why)
                log.warning("task %s of %s is unassigned: %s", rec.task_id, worker.worker_id,
                            why)
        self.offer_unassigned()

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

    def offer_unassigned(self) -> None:
        """Hand unassigned main tasks to live workers of their role that have none."""
        if self.state.stopped:
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
        task: CollectTask | LearnTask
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
            self.evaluations.forget_evaluated(task_id)
        return ended

    def check_task(self, task_id: str, worker_id: str, kind: TaskKind) -> TaskRecord:
        rec = self.tasks.get(task_id)
        if rec.worker_id != worker_id:
            raise WrongWorker(f"task '{task_id}' belongs to worker '{rec.worker_id}', "
                              f"not '{worker_id}'")
        if rec.kind is not kind:
            raise WrongWorker(f"task '{task_id}' is a {rec.kind.value} task, not {kind.value}")
        return rec

    def task_seed(self, task_id: str) -> int | None:
        try:
            return getattr(self.tasks.get(task_id).task, "seed", None)
        except UnknownTask:  # forgotten meanwhile (only the newest ended tasks are kept)
            return None
