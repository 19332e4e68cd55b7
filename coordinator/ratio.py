"""Holding learners and collectors to a replay ratio (train iterations per env step).

On two cores the learner and the collectors share the CPU, so letting either side run free
does not make training faster: it changes how many updates each env step gets, which is a
hyperparameter. Like Reverb's SampleToInsertRatio, the target is a line with a tolerance band:
learners may run ahead of it by `tolerance` iterations, collectors may run ahead by the same
amount of env steps' worth, and whichever side is ahead waits. Nothing is ever dropped: a
collector that is ahead is asked to pause before its next chunk, and the chunk it already made
is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplayRatio:
    updates_per_env_step: float | None
    learning_starts: int
    tolerance: int

    def target(self, env_steps: int) -> float:
        return max(0.0, (env_steps - self.learning_starts) * (self.updates_per_env_step or 0.0))

    def grantable(self, env_steps: int, granted_iterations: int, buffered_steps: int) -> int:
        """How many more train iterations may be handed out now."""
        if buffered_steps == 0 or env_steps < self.learning_starts:
            return 0
        if self.updates_per_env_step is None:
            return 1 << 30
        return max(0, int(self.target(env_steps) + self.tolerance) - granted_iterations)

    def collector_ahead(self, env_steps: int, granted_iterations: int) -> bool:
        """True when collectors should pause: the learner is over `tolerance` iterations
        behind the line."""
        if self.updates_per_env_step is None or env_steps < self.learning_starts:
            return False
        return granted_iterations < self.target(env_steps) - self.tolerance
