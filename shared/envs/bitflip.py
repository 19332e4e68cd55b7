"""Bit flipping (Andrychowicz et al. 2017, section 3.1): the classic test of hindsight
experience replay.

The state is n bits, the goal another n bits; an action flips one bit. The reward is -1 on
every step that does not end on the goal and 0 on the step that does, which also ends the
episode (terminated); after n steps it is truncated. A random policy almost never meets a
goal of 15 bits, so plain DQN sees nothing but -1 and learns nothing, while relabelling each
step with goals the episode did reach teaches it to move towards any goal.

Observations are gymnasium-robotics' goal dict: `observation` and `achieved_goal` are both the
state, `desired_goal` the goal (rlfleet's env wrapper flattens them, `shared/envs/goals.py`).
`compute_reward` and `compute_terminated` work on batches, as HER needs, and `info` says
`is_success`.

    env.id: rlfleet/BitFlip-v0
    env.kwargs: {n_bits: 15}
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BitFlipEnv(gym.Env):
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, n_bits: int = 15, max_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        if n_bits < 1:
            raise ValueError(f"n_bits={n_bits}: at least 1")
        self.n_bits = n_bits
        self.max_steps = n_bits if max_steps is None else max_steps
        bits = spaces.MultiBinary(n_bits)
        self.observation_space = spaces.Dict({"observation": bits, "achieved_goal": bits,
                                              "desired_goal": bits})
        self.action_space = spaces.Discrete(n_bits)
        self.render_mode = render_mode
        self.state = np.zeros(n_bits, dtype=np.int8)
        self.goal = np.zeros(n_bits, dtype=np.int8)
        self.steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits, dtype=np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits, dtype=np.int8)
        while np.array_equal(self.state, self.goal):  # an episode has something to do
            self.goal = self.np_random.integers(0, 2, self.n_bits, dtype=np.int8)
        self.steps = 0
        return self._obs(), {"is_success": False}

    def step(self, action):
        self.state[int(action)] ^= 1
        self.steps += 1
        success = bool(np.array_equal(self.state, self.goal))
        reward = float(self.compute_reward(self.state, self.goal, {}))
        truncated = not success and self.steps >= self.max_steps
        return self._obs(), reward, success, truncated, {"is_success": success}

    @staticmethod
    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray,
                       info: Any) -> np.ndarray:
        """0 where the achieved goal is the desired one, else -1; any leading batch shape."""
        miss = (np.asarray(achieved_goal) != np.asarray(desired_goal)).any(axis=-1)
        return -miss.astype(np.float32)

    @staticmethod
    def compute_terminated(achieved_goal: np.ndarray, desired_goal: np.ndarray,
                           info: Any) -> np.ndarray:
        """Reaching the goal ends the episode."""
        return (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(axis=-1)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return ("".join(map(str, self.state.tolist())) + " -> "
                    + "".join(map(str, self.goal.tolist())))
        return None
