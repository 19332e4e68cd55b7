"""The coordinator: membership, tasks, the replay (buffers and rate limits) and the run's state.

Routes (`coordinator/routes.py`) are thin: they validate a body and call one method here.
Background work runs in three threads this object owns and stops in `close()`:
- the *scheduler* reaps silent workers, starts evaluations when due and checks stop rules;
- the *commander* pushes tasks to workers (`POST <worker>/task`), retrying with backoff;
- the *janitor* deletes evicted chunks from storage in batches, off the request path, and
  garbage-collects chunks that were written but never announced.
Each blocks on a queue or an event with a timeout; none spins.

Crash safety (issue 7): a chunk report is appended to the write-ahead journal in storage
before it is acknowledged; a snapshot of generation G holds everything journalled before
it, so a restarted coordinator loads the newest snapshot and replays journals G, G+1, ...
Chunks released by buffers are deleted only after a later snapshot is written, so neither a
snapshot nor a journal ever refers to a deleted chunk. Tasks of dead workers wait,
unassigned, for the next worker of their role; queue chunks a dead learner held go back
to the queue.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import zlib
from collections import OrderedDict, deque
from pathlib import Path

import numpy as np

from coordinator.membership import Membership, UnknownWorker, Worker
from coordinator.replay import PartRefs, Replay, UnknownBuffer
from coordinator.runlog import RunLog
from coordinator.tasks import TaskRecord, TaskTable, UnknownTask
from shared.auth import load_token
from shared.config import RunConfig
from shared.http import HttpClient, HttpError
from shared.schemas import (
    ChunkMeta,
    ChunkReport,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
    CollectTask,
    EvalSummary,
    EvaluateTask,
    EvaluationReport,
    EvaluationResult,
    HeartbeatRequest,
    HeartbeatResponse,
    LearnInfo,
    LearnInfoResponse,
    LearnTask,
    RegisterRequest,
    RegisterResponse,
    Role,
    RunState,
    SampleRequest,
    TaskAccepted,
    TaskEnvelope,
    TaskKind,
    TaskState,
)
from shared.storage import StorageError, evaluated_blob, open_storage

log = logging.getLogger("rlfleet.coordinator")


def buffer_metrics(buffers: dict[str, dict]) -> dict[str, float]:
    """Buffer stats as flat metrics, `buffer/<name>/<stat>` (numeric stats only)."""
    return {f"buffer/{name}/{key}": float(value) for name, stats in buffers.items()
            for key, value in stats.items() if isinstance(value, int | float)}


def summarise_episodes(returns: list[float], lengths: list[int]) -> EvalSummary:
    r = np.asarray(returns, dtype=np.float64)
    return EvalSummary(episodes=len(r), return_mean=float(r.mean()), return_std=float(r.std()),
                       return_min=float(r.min()), return_max=float(r.max()),
                       length_mean=float(np.mean(lengths)))

EVAL_TIMEOUT_S = 120.0
_GC = "gc"  # the janitor's cue to look for chunks nobody announced
_FOREVER = 1 << 62


class WrongWorker(ValueError):
    """A worker acting on a task that belongs to another worker."""


class RateLimited(Exception):
    """Nothing may be sampled now; try again after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited: retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


class Coordinator:
    def __init__(self, cfg: RunConfig, storage_url: str, run_dir: str | Path | None = None,
                 clock=time.monotonic, resume: bool = False) -> None:
        self.cfg = cfg
        self.storage_url = storage_url
        # Workers guard `POST /task` with the cluster's token; read once, so a token file
        # that goes away mid-run cannot make the commander thread fail every push.
        self._token = load_token()
        self.run_dir = Path(run_dir) if run_dir else None
        self.storage = open_storage(storage_url, cfg.name)
        self.clock = clock
        self.started_at = clock()
        self.members = Membership(cfg.coordinator.heartbeat_timeout_s, clock)
        self.tasks = TaskTable()
        self.replay = Replay(cfg)
        # Counters, guarded by `_cond` (whose lock also orders sampling against inserts).
        self._cond = threading.Condition()
        self.env_steps = 0
        self.chunks_accepted = 0
        self.episodes = 0
        self.granted_batches = 0
        self.train_iterations = 0
        self.policy_version = -1
        self.learner_metrics: dict[str, float] = {}
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.recent_lengths: deque[int] = deque(maxlen=100)
        self.evaluations: deque[EvaluationResult] = deque(maxlen=1000)
        self.best_evaluation: EvaluationResult | None = None
        self.best_policy_version: int | None = None
        self.next_eval_at = max(cfg.eval.every_env_steps or 0, cfg.eval.start_env_steps)
        self.next_eval_iteration = cfg.eval.every_train_iterations or 0
        self.stop_reason: str | None = None
        self.solved = False
        self.stopped_at: float | None = None
        self.first_chunk_at: float | None = None  # when collection really began
        self.paused = False  # collection paused by an operator (learners go on)
        self.collectors_desired: int | None = None  # set by `rlfleet scale`
        self._rates: deque[tuple[float, int, int]] = deque(maxlen=64)
        self._eval_rr = 0
        # Background threads.
        self._closing = threading.Event()
        self._wake = threading.Event()
        self._push_q: queue.Queue[TaskRecord | None] = queue.Queue()
        self._delete_q: queue.Queue[list[str] | str | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._scheduler_loop, name="scheduler", daemon=True),
            threading.Thread(target=self._commander_loop, name="commander", daemon=True),
            threading.Thread(target=self._janitor_loop, name="janitor", daemon=True),
        ]
        self._started = False
        self._last_snapshot = clock()
        self._snapshot_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending_delete: list[str] = []  # released, deleted after the next snapshot
        self.snapshots_saved = 0
        # Orders journal appends against each other and against a snapshot's copy, so a
        # snapshot never misses a chunk that went into an older journal.
        self._journal_lock = threading.Lock()
        self._last_gc = clock()
        self._unannounced: dict[str, float] = {}  # chunk id -> when GC first saw it orphaned
        self._gc_deleted: OrderedDict[str, None] = OrderedDict()  # refused if reported late
        self.orphans_deleted = 0
        self.restored_from: dict | None = None
        resumed = self.restore() if resume else False
        if not resumed:
            self.storage.delete_journals(_FOREVER)  # a fresh run: nothing to replay
        self.runlog = RunLog(cfg, self.run_dir, self.env_steps if resumed else None)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Coordinator:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        self._push_q.put(None)
        self._delete_q.put(None)
        with self._cond:
            self._cond.notify_all()
        if self._started:
            for t in self._threads:
                t.join(timeout=5)
        try:
            self.save_snapshot(final=True)
        except Exception:  # closing must finish; the failure is logged for the operator
            log.exception("final snapshot failed")
        self.runlog.close()
        self.storage.close()

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def stop(self, reason: str) -> None:
        with self._cond:
            if self.stop_reason is None:
                self.stop_reason = reason
                self.stopped_at = self.clock()
                log.info("run stopping: %s", reason)
            self._cond.notify_all()

    # -- membership -------------------------------------------------------------------------

    def register(self, req: RegisterRequest) -> RegisterResponse:
        worker, is_new = self.members.register(req.role, req.url, req.worker_id)
        log.info("%s %s at %s", "registered" if is_new else "re-registered",
                 worker.worker_id, worker.url)
        if not is_new:  # a restart under the same id: its old process's work is lost
            self._requeue_held(worker.worker_id, "registered again")
            for rec in self.tasks.active_for(worker.worker_id):
                if rec.kind is TaskKind.EVALUATE:  # the new process never got it
                    self._push_q.put(rec)
        if not self.stopped:
            self._assign_main_task(worker)
        return RegisterResponse(
            worker_id=worker.worker_id, run_name=self.cfg.name, storage=self.storage_url,
            config=self.cfg.model_dump(mode="json"),
            heartbeat_interval_s=self.cfg.coordinator.heartbeat_interval_s)

    def heartbeat(self, worker_id: str, req: HeartbeatRequest) -> HeartbeatResponse:
        self.members.heartbeat(worker_id, req.status)
        return HeartbeatResponse(stop=self.stopped, paused=self.paused,
                                 policy_version=self._version_or_none(),
                                 env_steps=self.env_steps)

    def leave(self, worker_id: str) -> Worker:
        worker = self.members.leave(worker_id)
        self._requeue_held(worker_id, "left")
        for rec in self.tasks.active_for(worker_id):
            self.tasks.end(rec.task_id, TaskState.FINISHED)
        log.info("worker %s left", worker_id)
        return worker

    def _requeue_held(self, worker_id: str, why: str) -> None:
        with self._cond:
            n = self.replay.requeue_held_by(worker_id)
            if n:
                self._cond.notify_all()
        if n:
            log.warning("%s %s: %d queued chunks it held go back to the queue", worker_id,
                        why, n)

    def _worker_gone(self, worker: Worker, why: str) -> None:
        """A worker died: its learner chunks go back to the queue, its main task waits for
        the next worker of its role, its evaluation goes to another collector."""
        self._requeue_held(worker.worker_id, why)
        for rec in self.tasks.active_for(worker.worker_id):
            if rec.kind is TaskKind.EVALUATE:
                self._reassign_evaluation(rec, why)
            else:
                self.tasks.unassign(rec.task_id, why)
                log.warning("task %s of %s is unassigned: %s", rec.task_id, worker.worker_id,
                            why)
        self._offer_unassigned()

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
                self._push_q.put(rec)

    def _reassign_evaluation(self, rec: TaskRecord, why: str) -> None:
        busy = sorted(r.worker_id for r in self.tasks.active(TaskKind.COLLECT)
                      if r.state is TaskState.RUNNING and r.worker_id != rec.worker_id)
        alive = {w.worker_id for w in self.members.alive(Role.COLLECTOR)}
        targets = [w for w in busy if w in alive]
        if not targets:
            self.tasks.end(rec.task_id, TaskState.FAILED, why)
            return
        old, rec.worker_id = rec.worker_id, targets[0]
        rec.state, rec.reassignments = TaskState.PENDING, rec.reassignments + 1
        log.warning("evaluation %s moves from %s to %s: %s", rec.task_id, old, rec.worker_id,
                    why)
        self._push_q.put(rec)

    def _version_or_none(self) -> int | None:
        return self.policy_version if self.policy_version >= 0 else None

    # -- tasks ------------------------------------------------------------------------------

    def _assign_main_task(self, worker: Worker) -> TaskRecord:
        """The worker's own task if it had one (it restarted, or this coordinator did), an
        unassigned one of its role, or a new one."""
        kind = TaskKind.COLLECT if worker.role is Role.COLLECTOR else TaskKind.LEARN
        rec = self.tasks.claim(worker.worker_id, kind)
        if rec is not None:
            self._push_q.put(rec)
            return rec
        seed = self.cfg.seed * 100_003 + zlib.crc32(worker.worker_id.encode()) % 100_000
        if worker.role is Role.COLLECTOR:
            c = self.cfg.collector
            task = CollectTask(task_id=self.tasks.new_id(TaskKind.COLLECT), seed=seed,
                               mode=c.mode, chunk_size=c.chunk_size,
                               episodes_per_chunk=c.episodes_per_chunk)
        else:
            task = LearnTask(task_id=self.tasks.new_id(TaskKind.LEARN), seed=self.cfg.seed)
        rec = self.tasks.add(task, worker.worker_id)
        self._push_q.put(rec)
        return rec

    def end_task(self, task_id: str, worker_id: str | None, error: str | None) -> TaskRecord:
        rec = self.tasks.get(task_id)
        if worker_id is not None and rec.worker_id != worker_id:
            raise WrongWorker(f"task '{task_id}' belongs to worker '{rec.worker_id}', "
                              f"not '{worker_id}'")
        state = TaskState.FAILED if error else TaskState.FINISHED
        if error:
            log.warning("task %s failed on %s: %s", task_id, rec.worker_id, error)
        return self.tasks.end(task_id, state, error)

    def _check_task(self, task_id: str, worker_id: str, kind: TaskKind) -> TaskRecord:
        rec = self.tasks.get(task_id)
        if rec.worker_id != worker_id:
            raise WrongWorker(f"task '{task_id}' belongs to worker '{rec.worker_id}', "
                              f"not '{worker_id}'")
        if rec.kind is not kind:
            raise WrongWorker(f"task '{task_id}' is a {rec.kind.value} task, not {kind.value}")
        return rec

    def _push(self, rec: TaskRecord) -> None:
        """Send a task to its worker; retried with backoff, failed if the worker never takes
        it (the scheduler will notice the worker is gone)."""
        worker_id = rec.worker_id  # the task may move to another worker meanwhile
        try:
            worker = self.members.get(worker_id)
        except UnknownWorker:
            self.tasks.end(rec.task_id, TaskState.FAILED, "worker unknown")
            return
        client = HttpClient(worker.url, timeout_s=self.cfg.coordinator.task_push_timeout_s,
                            retries=5, backoff_s=0.1, token=self._token)
        try:
            ack = client.post("/task", TaskEnvelope(task=rec.task), TaskAccepted)
        except HttpError as err:
            log.warning("could not push %s to %s: %s", rec.task_id, worker_id, err)
            if rec.worker_id == worker_id and rec.state is TaskState.PENDING:
                self.tasks.end(rec.task_id, TaskState.FAILED, f"push failed: {err}")
            return
        finally:
            client.close()
        if ack.accepted and rec.state is TaskState.PENDING and rec.worker_id == worker_id:
            rec.state = TaskState.RUNNING

    # -- experience -------------------------------------------------------------------------

    def report_chunks(self, req: ChunkReport) -> ChunkReportResponse:
        """Journal, then index, then acknowledge: once the answer leaves, a coordinator
        crash cannot lose the chunks (a `StorageError` from the journal answers 503 and
        changes nothing; the collector keeps the report and sends it again)."""
        self.members.touch(req.worker_id)
        self._check_task(req.task_id, req.worker_id, TaskKind.COLLECT)
        with self._journal_lock:
            with self._cond:
                fresh = self._unseen(req.chunks)
                generation = self.replay.generation
            if fresh:
                self.storage.append_journal(generation,
                                            [self._journal_record(req.worker_id, fresh)])
            with self._cond:
                fresh, dead = self._accept(fresh, req.worker_id)
                # A paused run throttles collectors the same way a lagging learner does:
                # they finish the chunk at hand, report it, and wait for a permit.
                throttle = self.paused or self.replay.inserts_blocked()
                self._cond.notify_all()
                env_steps = self.env_steps
        if dead:
            self._release(dead)
        if fresh:
            self.runlog.on_chunks(fresh, env_steps, self.rates()[0])
        if self._evaluation_due():
            self._wake.set()
        return ChunkReportResponse(accepted=len(fresh), env_steps=env_steps,
                                   throttle_s=0.05 if throttle else 0.0, stop=self.stopped)

    def _unseen(self, metas: list) -> list:
        """New chunks of a report (under `_cond`): not held, not released lately, and not
        deleted as orphans (their bytes are gone: never acknowledge them)."""
        fresh = self.replay.unseen(metas)
        late = [m.chunk_id for m in fresh if m.chunk_id in self._gc_deleted]
        if late:
            log.warning("refusing %d chunks reported after they were deleted as never "
                        "announced: %s", len(late), late[:3])
            fresh = [m for m in fresh if m.chunk_id not in self._gc_deleted]
        return fresh

    @staticmethod
    def _journal_record(worker_id: str, metas: list) -> bytes:
        return json.dumps({"worker_id": worker_id,
                           "chunks": [m.model_dump(mode="json") for m in metas]}).encode()

    def _accept(self, metas: list, worker_id: str) -> tuple[list, list[str]]:
        """Index journalled chunks and count them (under `_cond`); (fresh, dead ids)."""
        fresh, dead = self.replay.insert(metas, self.train_iterations)
        for c in fresh:
            self.env_steps += c.length
            self.episodes += len(c.episode_returns)
            self.recent_returns.extend(c.episode_returns)
            self.recent_lengths.extend(c.episode_lengths)
        self.chunks_accepted += len(fresh)
        self.members.count_chunks(worker_id, len(fresh))
        if fresh and self.first_chunk_at is None:
            self.first_chunk_at = self.clock()
        return fresh, dead

    def collect_permit(self, req: CollectPermitRequest) -> CollectPermitResponse:
        self.members.touch(req.worker_id)
        deadline = self.clock() + req.wait_s
        with self._cond:
            while (not self.stopped and not self._closing.is_set()
                   and (self.paused or self.replay.inserts_blocked())):
                left = deadline - self.clock()
                if left <= 0:
                    return CollectPermitResponse(granted=False, stop=False)
                self._cond.wait(left)
        return CollectPermitResponse(granted=not self.stopped, stop=self.stopped)

    def sample(self, req: SampleRequest) -> tuple[list[str], list[PartRefs], int, int]:
        """(chunk ids, parts, batches granted, env steps). Raises `RateLimited` when nothing
        could be granted within `wait_s`."""
        self.members.touch(req.worker_id)
        plan = self.replay.plan(req)
        deadline = self.clock() + req.wait_s
        with self._cond:
            while True:
                grant = self.replay.grantable(plan, req.num_batches)
                if grant > 0 or self.stopped or self._closing.is_set():
                    break
                left = deadline - self.clock()
                if left <= 0:
                    raise RateLimited(0.05)
                self._cond.wait(left)
            if grant <= 0:
                return [], [], 0, self.env_steps
            chunk_ids, parts, dead = self.replay.sample(plan, grant, self.train_iterations,
                                                        self.policy_version, req.worker_id)
            self.granted_batches += grant
            self._cond.notify_all()  # collectors waiting for the learner may go on
            env_steps = self.env_steps
        if dead:
            self._release(dead)
        return chunk_ids, parts, grant, env_steps

    def learn_info(self, req: LearnInfo) -> LearnInfoResponse:
        self.members.touch(req.worker_id)
        with self._cond:
            self.replay.check_feedback(req.priorities, req.consumed)
            self.train_iterations = max(self.train_iterations, req.train_iterations)
            self.policy_version = max(self.policy_version, req.policy_version)
            self.learner_metrics = dict(req.metrics)
            self.replay.update_priorities(req.priorities)
            dead = self.replay.consume(req.consumed)
            self._cond.notify_all()
        if dead:
            self._release(dead)
        self.runlog.on_learn_info(req, self.env_steps, self.rates()[1])
        self._wake.set()
        return LearnInfoResponse(stop=self.stopped,
                                 best_policy_version=self.best_policy_version)

    # -- run control ------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> RunState:
        with self._cond:
            self.paused = paused
            self._cond.notify_all()  # waiting permits re-check
        log.info("collection %s by request", "paused" if paused else "resumed")
        return self.run_state()

    def scale(self, collectors: int) -> RunState:
        self.collectors_desired = collectors
        log.info("collectors wanted: %d", collectors)
        return self.run_state()

    def run_state(self) -> RunState:
        state = "stopped" if self.stopped else "paused" if self.paused else "running"
        return RunState(state=state, paused=self.paused, stop_reason=self.stop_reason,
                        collectors_desired=self.collectors_desired,
                        collectors_alive=len(self.members.alive(Role.COLLECTOR)))

    # -- evaluation -------------------------------------------------------------------------

    def _evaluation_due(self) -> bool:
        ev = self.cfg.eval
        if self.env_steps < ev.start_env_steps:
            return False
        return ((ev.every_env_steps is not None and self.env_steps >= self.next_eval_at)
                or (ev.every_train_iterations is not None
                    and self.train_iterations >= self.next_eval_iteration))

    def _maybe_start_evaluation(self) -> None:
        if self.stopped or not self._evaluation_due() or self.policy_version < 0:
            return
        if self.tasks.active(TaskKind.EVALUATE):
            return
        # Only collectors whose collect task is running: a worker whose loop failed has no
        # loop left to run the evaluation on.
        busy = {r.worker_id for r in self.tasks.active(TaskKind.COLLECT)
                if r.state is TaskState.RUNNING}
        collectors = sorted((w for w in self.members.alive(Role.COLLECTOR)
                             if w.worker_id in busy), key=lambda w: w.worker_id)
        if not collectors:
            return
        worker = collectors[self._eval_rr % len(collectors)]
        self._eval_rr += 1
        ev = self.cfg.eval
        task = EvaluateTask(task_id=self.tasks.new_id(TaskKind.EVALUATE),
                            policy_version=self.policy_version, episodes=ev.episodes,
                            num_envs=min(ev.num_envs, ev.episodes),
                            seed=self.cfg.seed * 7919 + self._eval_rr,
                            stochastic=ev.stochastic)
        if ev.every_env_steps is not None:
            self.next_eval_at = self.env_steps + ev.every_env_steps
        if ev.every_train_iterations is not None:
            self.next_eval_iteration = self.train_iterations + ev.every_train_iterations
        self._push_q.put(self.tasks.add(task, worker.worker_id))

    def report_evaluation(self, req: EvaluationReport) -> EvaluationResult:
        self.members.touch(req.worker_id)
        rec = self._check_task(req.task_id, req.worker_id, TaskKind.EVALUATE)
        det = summarise_episodes(req.deterministic.returns, req.deterministic.lengths)
        sto = (summarise_episodes(req.stochastic.returns, req.stochastic.lengths)
               if req.stochastic else None)
        result = EvaluationResult(
            task_id=req.task_id, worker_id=req.worker_id, policy_version=req.policy_version,
            env_steps=self.env_steps, train_iterations=self.train_iterations,
            episodes=det.episodes, return_mean=det.return_mean, return_std=det.return_std,
            length_mean=det.length_mean, wall_time=self.clock() - self.started_at,
            deterministic=det, stochastic=sto)
        self.tasks.end(rec.task_id, TaskState.FINISHED)
        self.evaluations.append(result)
        self.runlog.on_evaluation(result)
        if self.best_evaluation is None or result.return_mean > self.best_evaluation.return_mean:
            self.best_evaluation = result
            self._keep_best_policy(result)
        self._forget_evaluated(result.task_id)
        log.info("evaluation of policy %d at %d env steps: %.1f +- %.1f", result.policy_version,
                 result.env_steps, result.return_mean, result.return_std)
        stop_value = self.cfg.eval.stop_value
        if stop_value is not None and result.return_mean >= stop_value:
            self.solved = True
            self.stop(f"solved: evaluation return {result.return_mean:.1f} >= {stop_value}")
        return result

    def _keep_best_policy(self, result: EvaluationResult) -> None:
        """Keep the weights of the best-evaluated policy as `best_policy` in storage (and
        `best_policy.safetensors` in the run directory): they are the run's result. The
        collector stored what it evaluated under `evaluated-<task id>`, because published
        versions are pruned long before an evaluation ends."""
        try:
            blob = self.storage.get_blob(evaluated_blob(result.task_id))
            if blob is None:
                log.warning("no weights stored for evaluation %s; best policy not updated",
                            result.task_id)
                return
            self.storage.put_blob("best_policy", blob)
        except Exception:  # storage trouble must not fail the evaluation report
            log.exception("could not keep the policy of evaluation %s", result.task_id)
            return
        self.best_policy_version = result.policy_version
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / "best_policy.safetensors.tmp"
            tmp.write_bytes(blob)
            tmp.replace(self.run_dir / "best_policy.safetensors")

    def _forget_evaluated(self, task_id: str) -> None:
        try:
            self.storage.delete_blob(evaluated_blob(task_id))
        except Exception:  # an orphaned blob is harmless; logged for the operator
            log.exception("could not delete the weights of evaluation %s", task_id)

    # -- background threads -----------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        interval = min(self.cfg.coordinator.heartbeat_interval_s, 0.5)
        while not self._closing.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            try:
                self._tick()
            except Exception:  # the scheduler must outlive a bug in one tick; it is logged
                log.exception("scheduler tick failed")

    def _tick(self) -> None:
        now = self.clock()
        for worker in self.members.reap():
            log.warning("worker %s missed heartbeats for %.1fs: marked dead", worker.worker_id,
                        self.members.timeout_s)
            self._worker_gone(worker, "worker died")
        if self.tasks.any_unassigned():
            self._offer_unassigned()
        for rec in self.tasks.active(TaskKind.EVALUATE):
            if now - rec.created_at > EVAL_TIMEOUT_S:
                self.tasks.end(rec.task_id, TaskState.FAILED, "evaluation timed out")
        self._rates.append((now, self.env_steps, self.train_iterations))
        stop = self.cfg.stop
        if stop.max_env_steps is not None and self.env_steps >= stop.max_env_steps:
            self.stop(f"max_env_steps={stop.max_env_steps} reached")
        if stop.max_wall_s is not None and now - self.started_at >= stop.max_wall_s:
            self.stop(f"max_wall_s={stop.max_wall_s} reached")
        self._maybe_start_evaluation()
        self.runlog.on_tick(self.env_steps, self._info_scalars())
        every = self.cfg.coordinator.snapshot_interval_s
        if every is not None and now - self._last_snapshot >= every:
            try:
                self.save_snapshot()
            except StorageError as err:  # an outage: the next tick tries again
                log.warning("snapshot not saved: %s", err)
                self._last_snapshot = now
        if now - self._last_gc >= self.cfg.coordinator.gc_interval_s:
            self._last_gc = now
            self._delete_q.put(_GC)

    def _info_scalars(self) -> dict[str, float]:
        """The `info` scope: buffers, counters and the cluster, flat."""
        with self._cond:
            buffers = self.replay.stats()
            ledger = self.replay.ledger(self.chunks_accepted)
            counters = {"env_steps": self.env_steps,
                        "frames": self.env_steps * self.cfg.env.frame_skip,
                        "train_iterations": self.train_iterations,
                        "policy_version": self.policy_version,
                        "chunks_accepted": self.chunks_accepted, "episodes": self.episodes}
        out = buffer_metrics(buffers)
        out.update({f"counters/{k}": float(v) for k, v in counters.items()})
        for key in ("acknowledged", "in_buffers", "evicted", "consumed"):
            out[f"ledger/{key}"] = float(ledger[key])
        out.update({f"ledger/dropped/{k}": float(v) for k, v in ledger["dropped"].items()})
        out["ledger/orphans_deleted"] = float(self.orphans_deleted)
        for role in (Role.COLLECTOR, Role.LEARNER):
            out[f"cluster/{role.value}s_alive"] = float(len(self.members.alive(role)))
        active = [r for r in self.tasks.all() if r.active]
        out["cluster/tasks_active"] = float(len(active))
        for kind in TaskKind:
            out[f"cluster/tasks_{kind.value}"] = float(sum(r.kind is kind for r in active))
        return out

    # -- snapshots --------------------------------------------------------------------------

    def _counters(self) -> dict:
        return {"env_steps": self.env_steps, "chunks_accepted": self.chunks_accepted,
                "episodes": self.episodes, "granted_batches": self.granted_batches,
                "train_iterations": self.train_iterations,
                "policy_version": self.policy_version, "next_eval_at": self.next_eval_at,
                "next_eval_iteration": self.next_eval_iteration,
                "best_policy_version": self.best_policy_version,
                "evaluations": [e.model_dump() for e in self.evaluations],
                "best_evaluation": (self.best_evaluation.model_dump()
                                    if self.best_evaluation else None),
                "ledger": dict(self.replay.released_by),
                "wall_seconds": self.clock() - self.started_at,
                "first_chunk_s": (self.first_chunk_at - self.started_at
                                  if self.first_chunk_at is not None else None),
                "tasks": self.tasks.snapshot()}

    def _release(self, dead: list[str]) -> None:
        """Chunks no buffer refers to any more. With snapshots on, they are deleted only once
        a snapshot taken after their release is written: the snapshot a restart restores
        from must never refer to a deleted chunk."""
        if not dead:
            return
        if self.cfg.coordinator.snapshot_interval_s is None:
            self._delete_q.put(dead)
            return
        with self._pending_lock:
            self._pending_delete.extend(dead)

    def save_snapshot(self, final: bool = False) -> None:
        """Buffers' indexes and the run's counters to storage: copied under the lock so they
        describe one moment, encoded and written outside it so requests are not held up.
        Chunks released before the copy are deleted once it is written."""
        with self._snapshot_lock:  # one writer at a time (scheduler, shutdown)
            with self._journal_lock, self._cond:
                state, counters = self.replay.snapshot(), self._counters()
                self.replay.generation += 1  # later reports go to the next journal
                generation = self.replay.generation
                with self._pending_lock:
                    ready, self._pending_delete = self._pending_delete, []
            try:
                self.replay.write_snapshot(self.storage, state, counters, generation)
            except BaseException:
                with self._pending_lock:  # not safe to delete yet: keep them for the next
                    self._pending_delete = ready + self._pending_delete
                raise
            self._last_snapshot = self.clock()
            self.snapshots_saved += 1
            try:  # the snapshot holds everything the older journals did
                self.storage.delete_journals(generation)
            except StorageError as err:
                log.warning("old journals not deleted (the next snapshot will): %s", err)
        if ready:
            if final:  # the janitor has stopped
                self.storage.delete_chunks(ready)
            else:
                self._delete_q.put(ready)

    def restore(self) -> bool:
        """Continue from storage: the newest snapshot, then every journal from its
        generation on, in order. False (and a fresh run) if there is neither."""
        with self._cond:
            counters = self.replay.load(self.storage)
            generations = self.storage.journal_generations()
            if counters is None and not generations:
                log.info("no snapshot in %s: starting a fresh run", self.storage_url)
                return False
            if counters is not None:
                self._restore_counters(counters)
            start = self.replay.generation
            replayed = 0
            for generation in generations:
                if generation < start:
                    continue  # already in the snapshot (its deletion was cut short)
                for raw in self.storage.read_journal(generation):
                    record = json.loads(raw)
                    metas = [ChunkMeta.model_validate(m) for m in record["chunks"]]
                    fresh, dead = self._accept(metas, record["worker_id"])  # dedups
                    replayed += len(fresh)
                    self._release(dead)
            self.replay.generation = max([start, *generations])
        self.restored_from = {"generation": start, "journalled_chunks": replayed,
                              "env_steps": self.env_steps}
        log.info("restored run at %d env steps (snapshot generation %d, %d chunks from the "
                 "journal), %d items in buffers", self.env_steps, start, replayed,
                 self.replay.size())
        return True

    def _restore_counters(self, counters: dict) -> None:
        for key in ("env_steps", "chunks_accepted", "episodes", "granted_batches",
                    "train_iterations", "policy_version", "next_eval_at"):
            setattr(self, key, int(counters[key]))
        self.next_eval_iteration = int(counters.get("next_eval_iteration", 0))
        self.best_policy_version = counters.get("best_policy_version")
        self.evaluations.extend(EvaluationResult.model_validate(e)
                                for e in counters.get("evaluations", []))
        if counters.get("best_evaluation"):
            self.best_evaluation = EvaluationResult.model_validate(counters["best_evaluation"])
        now = self.clock()
        self.started_at = now - float(counters.get("wall_seconds", 0.0))
        if counters.get("first_chunk_s") is not None:
            self.first_chunk_at = self.started_at + float(counters["first_chunk_s"])
        restored = self.tasks.restore(counters.get("tasks", {}))
        for rec in restored:
            if rec.kind is TaskKind.EVALUATE:  # its report would find no one: run it again
                self.tasks.end(rec.task_id, TaskState.FAILED, "coordinator restarted")
                self.next_eval_at = min(self.next_eval_at, self.env_steps)
                self.next_eval_iteration = min(self.next_eval_iteration,
                                               self.train_iterations)

    def _commander_loop(self) -> None:
        while True:
            rec = self._push_q.get()
            if rec is None or self._closing.is_set():
                return
            if rec.active:
                self._push(rec)

    def _janitor_loop(self) -> None:
        while True:
            item = self._delete_q.get()
            if item is None:
                return
            gc = item == _GC
            ids: list[str] = [] if gc else list(item)
            while True:  # batch whatever else is already waiting
                try:
                    more = self._delete_q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._delete_q.put(None)
                    break
                if more == _GC:
                    gc = True
                else:
                    ids.extend(more)
            try:
                if ids:
                    self.storage.delete_chunks(ids)
                if gc:
                    self.collect_garbage()
            except StorageError as err:  # an outage: what is left is found by a later GC
                log.warning("storage clean-up failed (%d ids): %s", len(ids), err)
            except Exception:  # the janitor must survive a bug; logged for the operator
                log.exception("storage clean-up failed")

    def collect_garbage(self) -> list[str]:
        """Delete chunks in storage that no buffer holds, that are not waiting for a
        snapshot before deletion, and that nobody announced for `orphan_grace_s`: written
        by a collector that died before announcing them, or released by a coordinator that
        died before deleting them. Returns the ids deleted."""
        stored = self.storage.list_chunks()
        now = self.clock()
        with self._cond, self._pending_lock:
            pending = set(self._pending_delete)
            orphans = {c for c in stored if c not in self.replay.registry and c not in pending}
        for chunk_id in [c for c in self._unannounced if c not in orphans]:
            del self._unannounced[chunk_id]
        for chunk_id in orphans:
            self._unannounced.setdefault(chunk_id, now)
        grace = self.cfg.coordinator.orphan_grace_s
        expired = [c for c, seen in self._unannounced.items() if now - seen >= grace]
        if not expired:
            return []
        with self._cond:  # reported since the listing? then it is not an orphan
            expired = [c for c in expired if c not in self.replay.registry]
            for chunk_id in expired:  # a report arriving after this is refused
                self._gc_deleted[chunk_id] = None
            while len(self._gc_deleted) > 100_000:
                self._gc_deleted.popitem(last=False)
        self.storage.delete_chunks(expired)
        for chunk_id in expired:
            self._unannounced.pop(chunk_id, None)
        self.orphans_deleted += len(expired)
        log.warning("deleted %d chunks nobody announced within %.0fs", len(expired), grace)
        return expired

    # -- reading state ----------------------------------------------------------------------

    def buffer_chunks(self, name: str) -> list[str]:
        with self._cond:
            buf = self.replay.buffers.get(name)
            if buf is None:
                raise UnknownBuffer(name, "name")
            return buf.chunk_occurrences()

    def rates(self) -> tuple[float, float]:
        """env steps/s and train iterations/s over the last few seconds."""
        samples = [s for s in self._rates if s[0] >= self.clock() - 5.0]
        if len(samples) < 2:
            return 0.0, 0.0
        (t0, e0, i0), (t1, e1, i1) = samples[0], samples[-1]
        dt = max(t1 - t0, 1e-9)
        return (e1 - e0) / dt, (i1 - i0) / dt

    def _metrics(self, buffers: dict, returns: list[float], steps_per_s: float,
                 latest: dict | None) -> dict[str, float]:
        out = buffer_metrics(buffers)
        out["collect/env_steps_per_s"] = round(steps_per_s, 1)
        if returns:
            out.update({"collect/return_min": min(returns),
                        "collect/return_mean": float(np.mean(returns)),
                        "collect/return_max": max(returns),
                        "collect/episode_length": float(np.mean(self.recent_lengths))})
        out.update({f"train/{k}": v for k, v in self.learner_metrics.items()})
        for mode in ("deterministic", "stochastic"):
            summary = (latest or {}).get(mode)
            for key, value in (summary or {}).items():
                out[f"eval/{mode}/{key}"] = value
        return out

    def status(self) -> dict:
        now = self.clock()
        steps_per_s, iters_per_s = self.rates()
        latest = self.evaluations[-1].model_dump() if self.evaluations else None
        best = self.best_evaluation.model_dump() if self.best_evaluation else None
        returns = list(self.recent_returns)
        with self._cond:
            buffers = self.replay.stats()
            ledger = self.replay.ledger(self.chunks_accepted)
        ledger.update(orphans_deleted=self.orphans_deleted,
                      unannounced=len(self._unannounced),
                      journal_generation=self.replay.generation)
        return {
            "run": {"name": self.cfg.name,
                    "state": ("stopped" if self.stopped else "paused" if self.paused
                              else "running"),
                    "paused": self.paused, "collectors_desired": self.collectors_desired,
                    "stop_reason": self.stop_reason, "solved": self.solved,
                    "wall_seconds": round((self.stopped_at or now) - self.started_at, 3),
                    "stop_value": self.cfg.eval.stop_value, "storage": self.storage_url,
                    # workers' start-up (imports, registration) ends here
                    "first_chunk_s": (round(self.first_chunk_at - self.started_at, 3)
                                      if self.first_chunk_at is not None else None)},
            "counters": {"env_steps": self.env_steps, "train_iterations": self.train_iterations,
                         "granted_batches": self.granted_batches,
                         "policy_version": self.policy_version,
                         "chunks_accepted": self.chunks_accepted, "episodes": self.episodes},
            "rates": {"env_steps_per_s": round(steps_per_s, 1),
                      "train_iterations_per_s": round(iters_per_s, 1)},
            "buffer": {"size": self.replay.size(), "chunks": len(self.replay.registry)},
            "buffers": buffers,
            # Flat scalars under the names the logger uses (`scope/...`).
            "metrics": self._metrics(buffers, returns, steps_per_s, latest),
            "collect": {"episode_return_mean": float(np.mean(returns)) if returns else None,
                        "episode_length_mean": (float(np.mean(self.recent_lengths))
                                                if returns else None)},
            "train": self.learner_metrics,
            "workers": [w.to_json(now) for w in self.members.all()],
            "tasks": [r.to_json() for r in self.tasks.all() if r.active],
            "latest_evaluation": latest,
            "best_evaluation": best,
            "ledger": ledger,
        }


__all__ = ["Coordinator", "RateLimited", "UnknownBuffer", "UnknownTask", "UnknownWorker",
           "WrongWorker"]
