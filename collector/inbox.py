"""What the coordinator has asked of a collector: its collect task, the evaluations waiting
their turn, and (self-play) whom the next games meet.

The service's HTTP threads put what `POST /task` brings, and the adder's reporter thread puts
the opponents each chunk report's answer brings; the loop's thread takes. Evaluations wait
in a queue because the loop runs them between chunks, on its own thread, so collection and
evaluation never fight over the core.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque

from rlfleet.shared.contract.wire.experience import ChunkReportResponse
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask, Opponent

# Opponents kept for the next games; the coordinator sends more with every report's answer.
MAX_QUEUED_OPPONENTS = 4096


class TaskInbox:
    """The collect task (the newest push of it), evaluations in the order they came, and
    the self-play opponents assigned for the next games."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.collect: CollectTask | None = None
        self._evaluations: queue.Queue[EvaluateTask] = queue.Queue()
        self._opponents: deque[Opponent] = deque(maxlen=MAX_QUEUED_OPPONENTS)
        self._last_opponent = Opponent(name="main", kind="main")

    # -- the collect task -------------------------------------------------------------------

    def put_collect(self, task: CollectTask) -> None:
        """Keep `task` as the collect task. The coordinator pushes the same task again after
        it restarted: only a new task's opponents join the queue, not a repeat's."""
        with self._lock:
            if self.collect is None or self.collect.task_id != task.task_id:
                self._opponents.extend(task.opponents)
            self.collect = task

    def task_id(self) -> str | None:
        """The collect task's id, as the adder reports chunks under it (None before one)."""
        task = self.collect
        return task.task_id if task else None

    # -- evaluations ------------------------------------------------------------------------

    def put_evaluation(self, task: EvaluateTask) -> None:
        self._evaluations.put(task)

    def evaluations_waiting(self) -> bool:
        return not self._evaluations.empty()

    def next_evaluation(self) -> EvaluateTask | None:
        """The oldest evaluation waiting, or None."""
        try:
            return self._evaluations.get_nowait()
        except queue.Empty:
            return None

    # -- self-play opponents ----------------------------------------------------------------

    def on_answer(self, resp: ChunkReportResponse) -> None:
        """A chunk report's answer: the opponents it assigns join the queue."""
        self._opponents.extend(resp.opponents)

    def next_opponent(self) -> Opponent:
        """The next assigned opponent; the last one again while none is queued (the answer
        that brings more is on its way)."""
        with contextlib.suppress(IndexError):
            self._last_opponent = self._opponents.popleft()
        return self._last_opponent
