"""A corridor to walk down, and a curriculum that makes it longer: the built-in example of a
run's commander (`coordinator.commander`).

    env.id: rlfleet/Corridor-v0
    env.kwargs: {length: 8}
    coordinator.commander: rlfleet.shared.envs.corridor:CorridorCurriculum

`CorridorEnv` is a 1-D corridor of `length` cells. The agent starts in cell 0 and must reach
the last one: action 0 steps left, 1 steps right (a wall stops it at cell 0). Reaching the
end pays +1 and ends the episode (`info["is_success"]` True); every other step costs
`step_penalty`. An episode that has not reached the end after `time_limit * length` steps
is truncated (`is_success` False). An episode's last info also says its `corridor_length`
(`eval.info_keys: [corridor_length]` logs the length each evaluation walked). The
observation is (position / (length - 1), 1 / length): the same shape at every length, so
one network plays them all.

`CorridorCurriculum` starts the run in the shortest corridor of `LENGTHS` and moves every
collector (and the evaluations) to the next one each time an evaluation's success rate
reaches `SUCCESS_RATE`; an evaluation that succeeds in the longest one solves the run.
Subclass it to change the lengths or the bar.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.shared.contract.commander import BaseCommander, TaskEnvSettings
from rlfleet.shared.contract.wire.evaluation import EvaluationResult


class CorridorEnv(gym.Env):
    """Walk right to the end of a corridor of `length` cells (see the module)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, length: int = 8, step_penalty: float = 0.01, time_limit: float = 2.0,
                 render_mode: str | None = None) -> None:
        if int(length) < 2:
            raise ValueError(f"length={length}: a corridor has at least 2 cells")
        if time_limit < 1:
            raise ValueError(f"time_limit={time_limit}: under 1 the end is out of reach")
        self.length = int(length)
        self.step_penalty = float(step_penalty)
        self.max_steps = max(1, int(round(time_limit * self.length)))
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / (self.length - 1), 1.0 / self.length], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        self.pos = min(self.length - 1, max(0, self.pos + (1 if int(action) == 1 else -1)))
        reached = self.pos == self.length - 1
        reward = 1.0 if reached else -self.step_penalty
        truncated = not reached and self.steps >= self.max_steps
        info = ({"is_success": reached, "corridor_length": self.length}
                if reached or truncated else {})
        return self._obs(), reward, reached, truncated, info

    def render(self) -> str:
        cells = ["."] * self.length
        cells[-1] = "G"
        cells[self.pos] = "A"
        return "".join(cells)


if "rlfleet/Corridor-v0" not in gym.registry:
    gym.register("rlfleet/Corridor-v0", entry_point="rlfleet.shared.envs.corridor:CorridorEnv")


class CorridorCurriculum(BaseCommander):
    """Corridors of `LENGTHS`, each once the previous one is walked (see the module)."""

    LENGTHS: tuple[int, ...] = (4, 8, 16)
    SUCCESS_RATE = 0.9  # an evaluation's deterministic success rate that passes a level

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.level = 0  # index into LENGTHS
        self.passed_last = False

    @property
    def length(self) -> int:
        return self.LENGTHS[self.level]

    def collect_settings(self, worker_id: str, task_seed: int) -> TaskEnvSettings:
        return TaskEnvSettings(env_kwargs={"length": self.length})

    def on_evaluation(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> None:
        if env_kwargs.get("length") != self.length:
            return  # made before the last step up: it walked the previous corridor
        if (result.success_rate or 0.0) < self.SUCCESS_RATE:
            return
        if self.level + 1 < len(self.LENGTHS):
            self.level += 1
        else:
            self.passed_last = True

    def solved(self) -> str | None:
        if self.passed_last:
            return (f"solved: the curriculum's last corridor (length {self.length}) walked "
                    f"with success rate >= {self.SUCCESS_RATE}")
        return None

    def scalars(self) -> dict[str, float]:
        return {"level": float(self.level), "length": float(self.length)}

    def score(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> float | None:
        """The level walked first, then its success rate, then its mean return (in [-1, 1]
        on these corridors): the best policy is the one that walks the longest corridor."""
        length = env_kwargs.get("length")
        if length not in self.LENGTHS:
            return None
        return (10.0 * self.LENGTHS.index(length) + 2.0 * (result.success_rate or 0.0)
                + result.return_mean)

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "passed_last": self.passed_last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = min(int(state.get("level", 0)), len(self.LENGTHS) - 1)
        self.passed_last = bool(state.get("passed_last", False))
