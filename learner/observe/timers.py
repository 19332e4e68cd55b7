"""Where the learner's training thread spends its time, and how fast it trains.

`LearnerTimers` adds up seconds since the learner started: waiting for data, in updates (wall
time and the training thread's CPU time), publishing and saving checkpoints. `/status` shows
the totals; every learn-info report carries the same phases as milliseconds per train
iteration since the report before (`timers/learner/<phase>_ms`), which is what compares
across learners of different speeds. The training thread only adds to plain attributes: no
lock, no allocation per update, because the learner is the cluster's bottleneck.

`UpdateRate` turns the train-iteration counter that every heartbeat reads into updates per
second over the last few seconds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any


class LearnerTimers:
    """Seconds by phase. `publish_s` counts versions handed over on the training thread, most
    of them within an update: `per_iteration` reports `update` without them."""

    __slots__ = ("wait_s", "update_s", "update_cpu_s", "publish_s", "checkpoint_s", "_mark")

    def __init__(self) -> None:
        self.wait_s = 0.0          # waiting for a batch or a rollout
        self.update_s = 0.0        # learning on what came, wall time
        self.update_cpu_s = 0.0    # the training thread's CPU time within update_s
        self.publish_s = 0.0       # handing versions to the publisher (waiting, when asked)
        self.checkpoint_s = 0.0    # writing checkpoints
        self._mark: tuple[int, dict[str, float]] = (0, {})

    def count_update(self, t1: float, c1: float) -> None:
        """Wall and training-thread CPU time since (`time.perf_counter()`,
        `time.thread_time()`) = (t1, c1): their gap is time lost to the GIL or a core."""
        self.update_s += time.perf_counter() - t1
        self.update_cpu_s += time.thread_time() - c1

    def mark(self, train_iterations: int) -> None:
        """Count the next report's milliseconds per iteration from `train_iterations` on (a
        learner restored from a checkpoint does not start at 0)."""
        self._mark = (train_iterations, {})

    def per_iteration(self, train_iterations: int, chunk_fetch_s: float,
                      allreduce_s: float, extra: dict[str, float] | None = None
                      ) -> dict[str, float]:
        """ms per train iteration by phase since the last call (empty when no iteration
        passed). `chunk_fetch_s` and `allreduce_s` are totals kept elsewhere (the sampling
        thread or data process, the group's collectives), read here so that every phase
        covers the same iterations. `extra`: more totals so kept (a GPU learner's `gpu_busy`
        and `gpu_wait`, from CUDA events: the GPU in updates, and idle between them waiting
        for data)."""
        now = {"sample_wait": self.wait_s, "update": max(0.0, self.update_s - self.publish_s),
               "publish": self.publish_s, "chunk_fetch": chunk_fetch_s,
               "allreduce": allreduce_s, **(extra or {})}
        its = train_iterations - self._mark[0]
        out = {}
        if its > 0:
            before = self._mark[1]
            out = {f"{k}_ms": 1000.0 * (v - before.get(k, 0.0)) / its for k, v in now.items()}
        self._mark = (train_iterations, now)
        return out

    def utilisation(self) -> float | None:
        """The share of the training thread's time spent learning rather than waiting for
        data; None before either happened."""
        busy = self.update_s + self.wait_s
        return round(self.update_s / busy, 4) if busy else None

    def status(self, publish_thread_s: float) -> dict[str, Any]:
        """`/status`'s `timers`: the totals, and the publish thread's own seconds. An
        `update_cpu_s` well below `update_s` means the training thread waited for the GIL or
        for a core, not for data."""
        return {"update_s": round(self.update_s, 3),
                "update_cpu_s": round(self.update_cpu_s, 3),
                "wait_s": round(self.wait_s, 3),
                "publish_s": round(self.publish_s, 3),
                "publish_thread_s": round(publish_thread_s, 3)}


class UpdateRate:
    """Train iterations per second over the last `window_s`, from the counter's values at the
    moments it is asked (every heartbeat): no work on the training thread."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 samples: int = 64) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: deque[tuple[float, int]] = deque(maxlen=samples)

    def __call__(self, train_iterations: int) -> float:
        now = self.clock()
        self._seen.append((now, train_iterations))
        recent = [p for p in self._seen if p[0] >= now - self.window_s]
        (t0, i0), (t1, i1) = recent[0], recent[-1]
        return (i1 - i0) / (t1 - t0) if t1 > t0 else 0.0
