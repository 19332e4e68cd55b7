"""Exponential backoff with jitter, for the retries that many workers make at once.

When Redis restarts, every collector's chunk writer and every learner's publisher fail
together; with plain doubling they would all retry on the same beat and hit the server in
waves as it comes back. Each wait here is drawn from the upper half of the current step
("equal jitter": never less than half the step, so a retry still backs off), which spreads
the workers apart within a few retries.
"""

from __future__ import annotations

import random


class Backoff:
    """The waits of one retry streak: `next()` gives the next wait (jittered) and doubles the
    step up to `max_s`; `reset()` after a success starts the next streak at `first_s`."""

    def __init__(self, first_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"backoff needs 0 < first_s <= max_s, not {first_s}, {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        self.step_s = first_s
        self._rng = rng or random.Random()

    def next(self) -> float:
        wait = self.step_s * (0.5 + 0.5 * self._rng.random())
        self.step_s = min(self.max_s, self.step_s * 2)
        return wait

    def reset(self) -> None:
        self.step_s = self.first_s
