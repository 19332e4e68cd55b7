"""Task bookkeeping: what each worker was asked to do and how it went.

A worker's main task (collect or learn) outlives the worker: when the worker dies, the task
becomes *unassigned* and goes to the next worker of that role that needs one (the same
worker restarted under its old id gets its own task back). Tasks are saved in the
coordinator's snapshot, so a restarted coordinator hands the same tasks out again. Only the
newest `MAX_ENDED_TASKS` ended tasks are remembered; an older one is unknown (404).

Ape-X exploration (`collector.epsilon_schedule: apex`): every collect task handed out
carries a slot of `collector.apex_slots` and that slot's fixed epsilon (`apex_epsilon`). A
task handed out gets the lowest slot that no task of a live collector (pending or running)
holds, so a collector that left or died frees its slot for the next to join; a task given
back to its own worker (the collector restarted under its id, or the coordinator did) keeps
its slot while no other collector took it. With more collectors than slots, the extra ones
share: each takes the slot fewest collectors hold, the lowest of those (slots wrap).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlfleet.shared.contract.config import CollectorConfig, apex_epsilon
from rlfleet.shared.contract.wire.base import TaskKind, TaskState
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask, LearnTask, Task

AnyTask = CollectTask | LearnTask | EvaluateTask


# Collect tasks once carried copies of `collector.mode`, `collector.chunk_size` and
# `collector.episodes_per_chunk`; a snapshot written then still holds them, and the run config
# restored beside it says the same.
_DROPPED_COLLECT_FIELDS = ("mode", "chunk_size", "episodes_per_chunk")


class SavedTask(BaseModel):
    """A live task in a coordinator snapshot, of this version or an older one. (Built on
    first use, a snapshot, not at import: the coordinator's start-up is on the path to a
    run's first chunk.)"""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    task: Task
    worker_id: str
    reassignments: int = 0

    @field_validator("task", mode="before")
    @classmethod
    def _earlier_fields(cls, task: Any) -> Any:
        if isinstance(task, dict) and task.get("kind") == TaskKind.COLLECT:
            return {k: v for k, v in task.items() if k not in _DROPPED_COLLECT_FIELDS}
        return task


class SavedTasks(BaseModel):
    """The task table's part of a coordinator snapshot: its live tasks and id counter."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    next_id: int = 1
    tasks: list[SavedTask] = Field(default_factory=list)


_LIVE = (TaskState.PENDING, TaskState.RUNNING, TaskState.UNASSIGNED)
# Ended tasks kept for `GET /tasks` and late reports; older ones are forgotten, so that a run
# of a week (an evaluation task every few seconds) holds and scans a bounded table.
MAX_ENDED_TASKS = 1000


class UnknownTask(KeyError):
    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"task '{self.task_id}' does not exist"


@dataclass
class TaskRecord:
    task: AnyTask
    worker_id: str
    created_at: float
    state: TaskState = TaskState.PENDING
    error: str | None = None
    ended_at: float | None = None
    push_attempts: int = 0
    reassignments: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def kind(self) -> TaskKind:
        return self.task.kind

    @property
    def active(self) -> bool:
        """Work still to be done: pushed, running, or waiting for a worker."""
        return self.state in _LIVE

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "kind": self.kind.value, "worker_id": self.worker_id,
                "state": self.state.value, "error": self.error,
                "reassignments": self.reassignments,
                "task": self.task.model_dump(mode="json")}


class TaskTable:
    def __init__(self, collector: CollectorConfig | None = None) -> None:
        # Ape-X slots for collect tasks when the run's collectors explore so (None: no slots)
        self._apex = (collector if collector is not None
                      and collector.epsilon_schedule == "apex" else None)
        self._tasks: dict[str, TaskRecord] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._unassigned: set[str] = set()  # ids waiting for a worker: checked every tick
        self._ended: deque[str] = deque()  # ids of ended tasks, oldest first

    def new_id(self, kind: TaskKind) -> str:
        with self._lock:
            return f"{kind.value}-{next(self._ids)}"

    def add(self, task: AnyTask, worker_id: str) -> TaskRecord:
        rec = TaskRecord(task, worker_id, created_at=time.monotonic())
        with self._lock:
            self._place(rec, keep=False)
            self._tasks[task.task_id] = rec
        return rec

    def _place(self, rec: TaskRecord, keep: bool) -> None:
        """Under the lock: an Ape-X collect task's slot and epsilon, as it is handed out.
        `keep`: it goes back to its own worker, which keeps its slot unless a task of
        another live collector holds it now (or the slot no longer exists)."""
        c = self._apex
        if c is None or not isinstance(rec.task, CollectTask):
            return
        held = Counter(r.task.apex_slot for r in self._tasks.values()
                       if r is not rec and isinstance(r.task, CollectTask)
                       and r.state in (TaskState.PENDING, TaskState.RUNNING)
                       and r.task.apex_slot is not None)
        slot = rec.task.apex_slot
        if not keep or slot is None or slot >= c.apex_slots or held[slot]:
            slot = min(range(c.apex_slots), key=lambda i: (held[i], i))
        rec.task = rec.task.model_copy(update={
            "apex_slot": slot,
            "epsilon": apex_epsilon(slot, c.apex_slots, c.apex_eps, c.apex_alpha)})

    def get(self, task_id: str) -> TaskRecord:
        with self._lock:
            rec = self._tasks.get(task_id)
        if rec is None:
            raise UnknownTask(task_id)
        return rec

    def end(self, task_id: str, state: TaskState, error: str | None = None) -> TaskRecord:
        rec = self.get(task_id)
        with self._lock:
            if rec.active:
                rec.state, rec.error, rec.ended_at = state, error, time.monotonic()
                self._unassigned.discard(task_id)
                self._ended.append(task_id)
                while len(self._ended) > MAX_ENDED_TASKS:
                    self._tasks.pop(self._ended.popleft(), None)
        return rec

    def active_for(self, worker_id: str) -> list[TaskRecord]:
        """Tasks pushed to or running on this worker (not those waiting for a worker)."""
        with self._lock:
            return [r for r in self._tasks.values() if r.worker_id == worker_id and r.active
                    and r.state is not TaskState.UNASSIGNED]

    def unassign(self, task_id: str, reason: str) -> TaskRecord:
        """Its worker is gone: the task waits for another (`claim`)."""
        rec = self.get(task_id)
        with self._lock:
            if rec.active:
                rec.state, rec.error = TaskState.UNASSIGNED, reason
                self._unassigned.add(task_id)
        return rec

    def any_unassigned(self) -> bool:
        with self._lock:
            return bool(self._unassigned)

    def claim(self, worker_id: str, kind: TaskKind) -> TaskRecord | None:
        """A task of `kind` for this worker: its own live one (it restarted, or the
        coordinator did), else the oldest unassigned one, else None (make a new one). A
        collect task handed out again gets a new seed, so a new process does not replay
        the old one's episodes, and under Ape-X its slot (`_place`)."""
        with self._lock:
            mine = [r for r in self._tasks.values() if r.kind is kind
                    and r.worker_id == worker_id and r.state in _LIVE]
            if mine:
                rec = mine[0]
                rec.reassignments += 1
            else:
                free = [r for r in self._tasks.values() if r.kind is kind
                        and r.state is TaskState.UNASSIGNED]
                if not free:
                    return None
                rec = min(free, key=lambda r: r.created_at)
                rec.worker_id = worker_id
                rec.reassignments += 1
            if isinstance(rec.task, CollectTask):
                rec.task = rec.task.model_copy(update={"seed": rec.task.seed + 1_000_003})
                self._place(rec, keep=bool(mine))
            rec.state, rec.error = TaskState.PENDING, None
            self._unassigned.discard(rec.task_id)
            return rec

    def update_task(self, task_id: str, update: dict) -> TaskRecord | None:
        """Change fields of a live task (the commander's env settings of a collect task),
        for the caller to push again; None when the task ended or is unknown."""
        with self._lock:
            rec = self._tasks.get(task_id)
            if rec is None or not rec.active:
                return None
            rec.task = rec.task.model_copy(update=update)
            return rec

    def snapshot(self) -> SavedTasks:
        """Live tasks and the id counter, for the coordinator's snapshot."""
        with self._lock:
            live = [SavedTask(task=r.task, worker_id=r.worker_id,
                              reassignments=r.reassignments)
                    for r in self._tasks.values() if r.active]
            return SavedTasks(next_id=self._next_id(), tasks=live)

    def restore(self, saved: SavedTasks) -> list[TaskRecord]:
        """Tasks from a snapshot, all unassigned until their workers register again."""
        records = []
        with self._lock:
            self._ids = itertools.count(saved.next_id)
            for item in saved.tasks:
                rec = TaskRecord(item.task, item.worker_id,
                                 created_at=time.monotonic(), state=TaskState.UNASSIGNED,
                                 error="coordinator restarted",
                                 reassignments=item.reassignments)
                self._tasks[rec.task_id] = rec
                self._unassigned.add(rec.task_id)
                records.append(rec)
        return records

    def _next_id(self) -> int:
        """The number the next new id would get (without using it up)."""
        n = next(self._ids)
        self._ids = itertools.count(n)
        return n

    def active(self, kind: TaskKind | None = None) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self._tasks.values()
                    if r.active and (kind is None or r.kind is kind)]

    def all(self) -> list[TaskRecord]:
        with self._lock:
            return list(self._tasks.values())
