"""The run's state as the coordinator keeps it: its counters and flags, and the lock that
guards them.

`CoordinatorState.cond` is the coordinator's one lock over the run: it guards the counters
here, the replay's buffers (which are not thread-safe on their own) and the learner group,
and it orders sampling against inserts: a sampler waits on it until a chunk report, a
learner's progress, a stop or the coordinator's close notifies it. Whatever reads or changes
any of those is handed this object explicitly (the coordinator's parts, `Durability`,
`Readout` and, through the readout, the Prometheus collector), so no module borrows another's
lock. It is built first, before any part, so a part that must stop the run (the commander's
`EnvSettings`) is handed `stop` itself.

`SavedCounters` is this object's part of a coordinator snapshot (`snapshot.py`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rlfleet.shared.contract.wire.experience import ChunkMeta

log = logging.getLogger("rlfleet.coordinator")

RECENT_EPISODES = 100  # finished episodes whose returns and lengths `/status` averages

Phase = Literal["running", "paused", "stopped"]


class SavedCounters(BaseModel):
    """The run's counters in a snapshot. Every field has a default: a snapshot written
    before a field existed still reads."""

    model_config = ConfigDict(extra="ignore")

    env_steps: int = 0
    chunks_accepted: int = 0
    episodes: int = 0
    granted_batches: int = 0
    train_iterations: int = 0
    policy_version: int = -1
    wall_seconds: float = 0.0  # the run's wall time until the snapshot, across restarts
    first_chunk_s: float | None = None
    # what `rlfleet scale` asked for: a restarted coordinator must not make a launcher or
    # the compose scaler forget it
    collectors_desired: int | None = None


class CoordinatorState:
    """The run's counters and flags, guarded by `cond`.

    `started_at` is the clock reading the run's wall time counts from; a restore moves it
    back by the wall time the snapshot had run."""

    def __init__(self, clock: Callable[[], float], started_at: float | None = None) -> None:
        self.cond = threading.Condition()
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        # the coordinator is closing: long polls answer at once, the scheduler ends
        self.closing = threading.Event()
        # -- progress: changed under `cond` ----------------------------------------------
        self.env_steps = 0
        self.chunks_accepted = 0
        self.episodes = 0
        self.granted_batches = 0
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

    def close(self) -> None:
        """The coordinator is closing: every waiter answers now."""
        self.closing.set()
        with self.cond:
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

    def snapshot(self) -> SavedCounters:
        """The counters for a snapshot (under `cond`)."""
        return SavedCounters(
            env_steps=self.env_steps, chunks_accepted=self.chunks_accepted,
            episodes=self.episodes, granted_batches=self.granted_batches,
            train_iterations=self.train_iterations, policy_version=self.policy_version,
            wall_seconds=self.clock() - self.started_at, first_chunk_s=self.first_chunk_s(),
            collectors_desired=self.collectors_desired)

    def restore(self, saved: SavedCounters) -> None:
        """Put a snapshot's counters back (under `cond`)."""
        self.env_steps = saved.env_steps
        self.chunks_accepted = saved.chunks_accepted
        self.episodes = saved.episodes
        self.granted_batches = saved.granted_batches
        self.train_iterations = saved.train_iterations
        self.policy_version = saved.policy_version
        if saved.collectors_desired is not None:
            self.collectors_desired = saved.collectors_desired
        self.started_at = self.clock() - saved.wall_seconds
        if saved.first_chunk_s is not None:
            self.first_chunk_at = self.started_at + saved.first_chunk_s


__all__ = ["RECENT_EPISODES", "CoordinatorState", "Phase", "SavedCounters"]
