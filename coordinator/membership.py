"""Who is in the cluster: registration, heartbeats, leaving, and declaring the silent dead.

A worker that registers again under its id (a restart, or a coordinator that restarted and
answered its heartbeat with 404) replaces its old entry instead of becoming a second worker.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from rlfleet.shared.contract.schemas import Role, WorkerResources, WorkerState

MAX_GONE_WORKERS = 256  # dead or departed workers remembered (for `GET /workers`)


class UnknownWorker(KeyError):
    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.worker_id = worker_id

    def __str__(self) -> str:
        return f"worker '{self.worker_id}' is not registered"


@dataclass
class Worker:
    worker_id: str
    role: Role
    url: str
    registered_at: float
    last_seen: float
    state: WorkerState = WorkerState.ALIVE
    registrations: int = 1
    status: dict[str, float] = field(default_factory=dict)
    chunks_accepted: int = 0  # chunks this worker reported that the coordinator took
    resources: WorkerResources | None = None  # as its last registration reported them

    def to_json(self, now: float) -> dict:
        return {"worker_id": self.worker_id, "role": self.role.value, "url": self.url,
                "state": self.state.value, "registrations": self.registrations,
                "seconds_since_heartbeat": round(now - self.last_seen, 3),
                "chunks_accepted": self.chunks_accepted, "status": self.status,
                "resources": (self.resources.model_dump(mode="json")
                              if self.resources is not None else None)}


class Membership:
    def __init__(self, heartbeat_timeout_s: float, clock=time.monotonic) -> None:
        self.timeout_s = heartbeat_timeout_s
        self.clock = clock
        self._workers: dict[str, Worker] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def register(self, role: Role, url: str, worker_id: str | None,
                 resources: WorkerResources | None = None) -> tuple[Worker, bool]:
        """Returns (worker, is_new). An existing id keeps its identity but takes the new
        role, URL and resources (those of the process registering now); it is alive again."""
        now = self.clock()
        with self._lock:
            if worker_id is None:
                worker_id = f"{role.value}-{next(self._counter)}"
                while worker_id in self._workers:
                    worker_id = f"{role.value}-{next(self._counter)}"
            old = self._workers.get(worker_id)
            if old is not None:
                old.role, old.url, old.last_seen = role, url, now
                old.resources = resources
                old.state = WorkerState.ALIVE
                old.registrations += 1
                return old, False
            w = Worker(worker_id, role, url, registered_at=now, last_seen=now,
                       resources=resources)
            self._workers[worker_id] = w
            self._forget_gone()
            return w, True

    def _forget_gone(self) -> None:
        """Keep only the newest `MAX_GONE_WORKERS` dead or departed workers (under the lock):
        a week of scaling and restarts under new ids must not grow the table for good."""
        gone = [w for w in self._workers.values() if w.state is not WorkerState.ALIVE]
        if len(gone) > MAX_GONE_WORKERS:
            gone.sort(key=lambda w: w.last_seen)
            for w in gone[:len(gone) - MAX_GONE_WORKERS]:
                del self._workers[w.worker_id]

    def get(self, worker_id: str) -> Worker:
        with self._lock:
            w = self._workers.get(worker_id)
        if w is None:
            raise UnknownWorker(worker_id)
        return w

    def heartbeat(self, worker_id: str, status: dict[str, float]) -> Worker:
        """Raises UnknownWorker for ids never seen or that left; a worker declared dead that
        speaks again must register again, so its tasks are handed out afresh."""
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None or w.state is not WorkerState.ALIVE:
                raise UnknownWorker(worker_id)
            w.last_seen = self.clock()
            w.status = dict(status)
            return w

    def touch(self, worker_id: str) -> Worker:
        """Any authenticated request from a worker counts as a sign of life."""
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None or w.state is not WorkerState.ALIVE:
                raise UnknownWorker(worker_id)
            w.last_seen = self.clock()
            return w

    def count_chunks(self, worker_id: str, n: int) -> None:
        with self._lock:
            w = self._workers.get(worker_id)
            if w is not None:
                w.chunks_accepted += n

    def leave(self, worker_id: str) -> Worker:
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None:
                raise UnknownWorker(worker_id)
            w.state = WorkerState.LEFT
            return w

    def reap(self) -> list[Worker]:
        """Mark alive workers silent for longer than the timeout as dead; returns them."""
        now = self.clock()
        dead = []
        with self._lock:
            for w in self._workers.values():
                if w.state is WorkerState.ALIVE and now - w.last_seen > self.timeout_s:
                    w.state = WorkerState.DEAD
                    dead.append(w)
        return dead

    def alive(self, role: Role | None = None) -> list[Worker]:
        with self._lock:
            return [w for w in self._workers.values() if w.state is WorkerState.ALIVE
                    and (role is None or w.role is role)]

    def all(self) -> list[Worker]:
        with self._lock:
            return list(self._workers.values())
