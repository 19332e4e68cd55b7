"""Task bookkeeping: what each worker was asked to do and how it went."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from shared.schemas import CollectTask, EvaluateTask, LearnTask, TaskKind, TaskState

AnyTask = CollectTask | LearnTask | EvaluateTask


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
    extra: dict = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def kind(self) -> TaskKind:
        return self.task.kind

    @property
    def active(self) -> bool:
        return self.state in (TaskState.PENDING, TaskState.RUNNING)

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "kind": self.kind.value, "worker_id": self.worker_id,
                "state": self.state.value, "error": self.error,
                "task": self.task.model_dump(mode="json")}


class TaskTable:
    def __init__(self) -> None:
        self._tasks: dict[str, TaskRecord] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def new_id(self, kind: TaskKind) -> str:
        return f"{kind.value}-{next(self._ids)}"

    def add(self, task: AnyTask, worker_id: str) -> TaskRecord:
        rec = TaskRecord(task, worker_id, created_at=time.monotonic())
        with self._lock:
            self._tasks[task.task_id] = rec
        return rec

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
        return rec

    def active_for(self, worker_id: str) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self._tasks.values() if r.worker_id == worker_id and r.active]

    def active(self, kind: TaskKind | None = None) -> list[TaskRecord]:
        with self._lock:
            return [r for r in self._tasks.values()
                    if r.active and (kind is None or r.kind is kind)]

    def all(self) -> list[TaskRecord]:
        with self._lock:
            return list(self._tasks.values())
