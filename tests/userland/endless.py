"""An environment whose episodes never end, named by import path (`endless:Endless`) like a
user's own: no terminal state and no time limit, so only `eval.max_steps` ends an
evaluation episode on it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Endless(gym.Env):
    """Two actions; action 1 pays 1, action 0 pays nothing. The observation is the step
    count within the episode (scaled), so a reset shows as a drop back to 0."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / 1000.0, 1.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(int(action) == 1), False, False, {}
