"""Who is in the cluster: registration, heartbeats, leaving, and declaring the silent dead.

A worker id names one process at a time. A worker that registers again under its id from
the URL its entry has (a restart, or a coordinator that restarted and answered its heartbeat
with 404) replaces its old entry instead of becoming a second worker. From another URL, it
replaces the entry only when the holder is no longer there: declared dead or gone, silent
past the heartbeat timeout, or found gone by the caller (nothing listens at its URL: a
process restarted on another port). Otherwise two live processes would share one id, and
every registration of one would replace the other's: tasks pushed back and forth, a learner
group re-formed at each turn. So the newcomer is refused (`WorkerIdTaken`), and a process
whose entry another has taken is told so at its next heartbeat (`Superseded`).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from rlfleet.shared.contract.wire.base import Role, WorkerState
from rlfleet.shared.contract.wire.membership import WorkerResources

MAX_GONE_WORKERS = 256  # dead or departed workers remembered (for `GET /workers`)


class UnknownWorker(KeyError):
    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.worker_id = worker_id

    def __str__(self) -> str:
        return f"worker '{self.worker_id}' is not registered"


class WorkerIdTaken(Exception):
    """A registration under an id that a live process at another URL holds."""

    def __init__(self, worker_id: str, holder_url: str, silent_s: float) -> None:
        super().__init__(worker_id, holder_url)
        self.worker_id = worker_id
        self.holder_url = holder_url
        self.silent_s = silent_s

    def __str__(self) -> str:
        return (f"worker_id={self.worker_id!r} is held by a live worker at {self.holder_url} "
                f"(heard from {self.silent_s:.1f}s ago): two processes cannot share one "
                f"worker id; give this one another (--worker-id, RLFLEET_WORKER_ID), or stop "
                f"the one at {self.holder_url}")


class Superseded(Exception):
    """A heartbeat from a process whose id another process at another URL now holds."""

    def __init__(self, worker_id: str, url: str, holder_url: str) -> None:
        super().__init__(worker_id, url, holder_url)
        self.worker_id = worker_id
        self.url = url
        self.holder_url = holder_url

    def __str__(self) -> str:
        return (f"superseded: worker_id={self.worker_id!r} is registered from "
                f"{self.holder_url} now, not from {self.url}: another process holds the id "
                "(this one was silent past the heartbeat timeout, or never held it), and this "
                "one must stop")


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

    def holder(self, worker_id: str | None, url: str) -> Worker | None:
        """The live worker that holds `worker_id` at another URL than `url`: alive, and
        heard from within the heartbeat timeout. None when the id is free, or held from
        `url` (a registration from there is a restart of that worker)."""
        if worker_id is None:
            return None
        with self._lock:
            w = self._workers.get(worker_id)
            return w if w is not None and self._holds(w, url, self.clock()) else None

    def _holds(self, w: Worker, url: str, now: float) -> bool:
        return (w.url != url and w.state is WorkerState.ALIVE
                and now - w.last_seen <= self.timeout_s)

    def register(self, role: Role, url: str, worker_id: str | None,
                 resources: WorkerResources | None = None,
                 gone_url: str | None = None) -> tuple[Worker, bool]:
        """Returns (worker, is_new). An existing id keeps its identity but takes the new
        role, URL and resources (those of the process registering now); it is alive again.
        Raises `WorkerIdTaken` when a live worker holds the id at another URL (`holder`),
        unless that URL is `gone_url`: the caller found nothing there any more."""
        now = self.clock()
        with self._lock:
            if worker_id is None:
                worker_id = f"{role.value}-{next(self._counter)}"
                while worker_id in self._workers:
                    worker_id = f"{role.value}-{next(self._counter)}"
            old = self._workers.get(worker_id)
            if old is not None and self._holds(old, url, now) and old.url != gone_url:
                raise WorkerIdTaken(worker_id, old.url, now - old.last_seen)
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

    def heartbeat(self, worker_id: str, status: dict[str, float],
                  url: str | None = None) -> Worker:
        """Raises UnknownWorker for ids never seen or that left; a worker declared dead that
        speaks again must register again, so its tasks are handed out afresh. Raises
        `Superseded` for a heartbeat from `url` when the id is registered from another URL
        now: the sender was replaced while silent, and must not live on beside the new one."""
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None or w.state is not WorkerState.ALIVE:
                raise UnknownWorker(worker_id)
            if url is not None and url != w.url:
                raise Superseded(worker_id, url, w.url)
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

    def next_expiry(self) -> float | None:
        """When, on the clock, the next live worker is past the heartbeat timeout if it
        stays silent; None with no live worker. The scheduler wakes then, so a silent
        worker is declared dead when its timeout passes, not up to a tick later."""
        with self._lock:
            seen = [w.last_seen for w in self._workers.values()
                    if w.state is WorkerState.ALIVE]
        return min(seen) + self.timeout_s if seen else None

    def alive(self, role: Role | None = None) -> list[Worker]:
        with self._lock:
            return [w for w in self._workers.values() if w.state is WorkerState.ALIVE
                    and (role is None or w.role is role)]

    def all(self) -> list[Worker]:
        with self._lock:
            return list(self._workers.values())
