"""The task dispatcher: the one thread that pushes tasks to workers (`POST <worker>/task`).

Tasks are queued when they are created, claimed or moved, and sent from here, off the
request path: a worker that is slow to answer must not hold up the registration or the
scheduler tick that gave it the task. A push is retried with backoff; one that never lands
fails the task, and the scheduler, noticing the silent worker, hands the work to another.

Workers guard `POST /task` with the cluster's token. The coordinator reads it once, at
start, so a token file that goes away mid-run cannot make every push fail.
"""

from __future__ import annotations

import logging
import queue
import threading

from rlfleet.coordinator.membership import Membership, UnknownWorker
from rlfleet.coordinator.tasks import TaskRecord, TaskTable
from rlfleet.shared.contract.wire.base import TaskState
from rlfleet.shared.contract.wire.tasks import TaskAccepted, TaskEnvelope
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")


class TaskDispatcher:
    """Sends queued tasks to their workers, one at a time, in order, off the request path.
    (Not to be confused with the run's commander, `coordinator.commander`, which chooses
    the env settings of tasks: `rlfleet.shared.contract.commander`.)"""

    def __init__(self, cfg: RunConfig, members: Membership, tasks: TaskTable,
                 token: str | None) -> None:
        self.cfg = cfg
        self.members = members
        self.tasks = tasks
        self._token = token
        self._closing = threading.Event()
        self._queue: queue.Queue[TaskRecord | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="dispatcher", daemon=True)

    def push(self, rec: TaskRecord) -> None:
        """Send the task to its worker, soon (tasks go in the order they were queued)."""
        self._queue.put(rec)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Tasks still queued are dropped: the coordinator is closing (a snapshot keeps
        them, for a restarted one to hand out again)."""
        self._closing.set()
        self._queue.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while True:
            rec = self._queue.get()
            if rec is None or self._closing.is_set():
                return
            if rec.active:
                self._send(rec)

    def _send(self, rec: TaskRecord) -> None:
        """Retried with backoff, failed if the worker never takes it (the scheduler will
        notice the worker is gone)."""
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
