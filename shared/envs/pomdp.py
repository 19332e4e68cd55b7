"""CartPole with its velocities hidden: a partially observable env of the project's own.

    env.id: rlfleet/CartPoleNoVel-v0

The agent sees the cart's position x and the pole's angle theta, not their velocities
(x_dot, theta_dot), so one observation does not say where the system is going: a policy
must remember the previous ones (an LSTM, as R2D2's) or be given them (frame stacking).
It is the classic test of recurrent agents (Hausknecht and Stone's flickering and
velocity-less games, and the velocity-less CartPole of many recurrent RL libraries).
Dynamics, rewards, the 500-step limit and the 475 solve mark are CartPole-v1's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

# Indices of the observed parts of CartPole-v1's (x, x_dot, theta, theta_dot).
OBSERVED = np.array([0, 2])


class CartPoleNoVelEnv(gym.ObservationWrapper):
    """CartPole-v1 observing (x, theta) only (gymnasium's registration adds the time
    limit, as for CartPole-v1)."""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(CartPoleEnv(render_mode=render_mode))
        box = self.env.observation_space
        assert isinstance(box, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(box.low[OBSERVED], box.high[OBSERVED],
                                                dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[OBSERVED]
