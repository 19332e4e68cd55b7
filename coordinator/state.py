"""The run's state as the coordinator keeps it: its counters and flags, the lock that guards
them, and the snapshot format.

`CoordinatorState.cond` is the coordinator's one lock over the run: it guards the counters
here, the replay's buffers (which are not thread-safe on their own) and the learner group,
and it orders sampling against inserts: a sampler waits on it until a chunk report, a
learner's progress or a stop notifies it. Whatever reads or changes any of those is handed
this object explicitly (the coordinator's request handlers, `Durability`, `Readout` and,
through the readout, the Prometheus collector), so no module borrows another's lock.

`snapshot()` is what a coordinator snapshot saves beside the buffers' indexes, and
`restore()` puts it back. Their keys are the snapshot format: a snapshot written by an older
version must still restore, so keys added since have defaults.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.tasks import TaskTable
from rlfleet.shared.contract.wire.base import TaskKind
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay

log = logging.getLogger("rlfleet.coordinator")

RECENT_EPISODES = 100  # finished episodes whose returns and lengths `/status` averages

Phase = Literal["running", "paused", "stopped"]


class CoordinatorState:
    """The run's counters and flags, guarded by `cond`, and the snapshot of them and of the
    parts a restarted coordinator must get back: the evaluation schedule, the chunk ledger,
    the task table and the league (`matchmaker`: None for a single-agent run).

    `started_at` is the clock reading the run's wall time counts from; a restore moves it
    back by the wall time the snapshot had run."""

    def __init__(self, clock: Callable[[], float], replay: Replay, tasks: TaskTable,
                 evaluations: EvaluationSchedule, matchmaker: Matchmaker | None,
                 started_at: float | None = None) -> None:
        self.cond = threading.Condition()
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        self._replay = replay
        self._tasks = tasks
        self._evaluations = evaluations
        self._matchmaker = matchmaker
        # -- progress: changed under `cond` ----------------------------------------------
        self.env_steps = 0
        self.chunks_accepted = 0
        self.episodes = 0
        self.granted_batches = 0
        # the run's commander (coordinator/env_settings.py): asked for its state before a
        # snapshot is copied, outside the lock (it is user code); given back what a resumed
        # run restored
        self.commander_state: Callable[[], Any] = lambda: None
        self.restored_commander: Any = None
        self.train_iterations = 0
        self.policy_version = -1
        self.learner_metrics: dict[str, float] = {}  # averaged over the group's ranks
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.recent_lengths: deque[int] = deque(maxlen=RECENT_EPISODES)
        self.first_chunk_at: float | None = None  # when collection really began
        # -- run control ------------------------------------------------------------------
        self.stop_reason: str | None = None
        self.solved = False
        self.stopped_at: float | None = None
        self.paused = False  # collection paused by an operator (learners go on)
        self.collectors_desired: int | None = None  # set by `rlfleet scale`

    # -- run control ------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    @property
    def phase(self) -> Phase:
        """What `/run` and `/status` call the run's state."""
        return "stopped" if self.stopped else "paused" if self.paused else "running"

    def stop(self, reason: str, solved: bool = False) -> None:
        """Stop the run (the first reason is kept) and wake every waiter, so long polls
        answer at once. `solved`: an evaluation reached the stop value or a league rule."""
        with self.cond:
            if solved:
                self.solved = True
            if self.stop_reason is None:
                self.stop_reason = reason
                self.stopped_at = self.clock()
                log.info("run stopping: %s", reason)
            self.cond.notify_all()

    def version_or_none(self) -> int | None:
        """The latest published policy version; None before the first."""
        return self.policy_version if self.policy_version >= 0 else None

    def wall_seconds(self, now: float) -> float:
        """Seconds the run has run until `now`, or until it stopped, across restarts."""
        return (self.stopped_at or now) - self.started_at

    def first_chunk_s(self) -> float | None:
        """Seconds from the run's start to its first accepted chunk: the workers' start-up."""
        if self.first_chunk_at is None:
            return None
        return self.first_chunk_at - self.started_at

    # -- progress ---------------------------------------------------------------------------

    def count_chunks(self, fresh: list[ChunkMeta]) -> None:
        """Count newly accepted chunks and their finished episodes (under `cond`)."""
        for c in fresh:
            self.env_steps += c.length
            self.episodes += len(c.episode_returns)
            self.recent_returns.extend(c.episode_returns)
            self.recent_lengths.extend(c.episode_lengths)
        self.chunks_accepted += len(fresh)
        if fresh and self.first_chunk_at is None:
            self.first_chunk_at = self.clock()

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """What a snapshot saves beside the buffers (under `cond`)."""
        return {"env_steps": self.env_steps, "chunks_accepted": self.chunks_accepted,
                "episodes": self.episodes, "granted_batches": self.granted_batches,
                "train_iterations": self.train_iterations,
                "policy_version": self.policy_version, **self._evaluations.counters(),
                "ledger": dict(self._replay.released_by),
                "wall_seconds": self.clock() - self.started_at,
                "first_chunk_s": self.first_chunk_s(),
                "tasks": self._tasks.snapshot(),
                # what `rlfleet scale` asked for: a restarted coordinator must not make a
                # launcher or the compose scaler forget it
                "collectors_desired": self.collectors_desired,
                "league": self._matchmaker.state() if self._matchmaker else None}

    def restore(self, counters: dict) -> None:
        """Put a snapshot's counters back (under `cond`; the replay has loaded its own part,
        the ledger, with its buffers). Evaluations the snapshot had running are failed: their
        reports would find no one, so new ones fall due at once."""
        self.env_steps = int(counters["env_steps"])
        self.chunks_accepted = int(counters["chunks_accepted"])
        self.episodes = int(counters["episodes"])
        self.granted_batches = int(counters["granted_batches"])
        self.train_iterations = int(counters["train_iterations"])
        self.policy_version = int(counters["policy_version"])
        self.restored_commander = counters.get("commander")
        self._evaluations.restore(counters)
        if self._matchmaker is not None:
            self._matchmaker.restore(counters.get("league"))
        if counters.get("collectors_desired") is not None:
            self.collectors_desired = int(counters["collectors_desired"])
        self.started_at = self.clock() - float(counters.get("wall_seconds", 0.0))
        if counters.get("first_chunk_s") is not None:
            self.first_chunk_at = self.started_at + float(counters["first_chunk_s"])
        for rec in self._tasks.restore(counters.get("tasks", {})):
            if rec.kind is TaskKind.EVALUATE:
                self._evaluations.rerun(rec, self.env_steps, self.train_iterations)


__all__ = ["RECENT_EPISODES", "CoordinatorState", "Phase"]
