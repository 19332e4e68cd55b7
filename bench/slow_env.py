"""CartPole-v1 whose every step takes a fixed extra time: a stand-in for a slow simulator.

Real simulators spend milliseconds per step, mostly off the Python interpreter (in C, on a
GPU, in another process); CartPole spends microseconds. Sleeping rather than spinning keeps
that property: the step's time is wall time, not CPU, so many collectors can share a few
cores the way they would share them with a simulator that waits on something else, and the
scaling bench measures the fleet's overhead rather than the cores' count.

Named by import path in a config: `env.id: bench.slow_env:SlowCartPole`,
`env.kwargs: {step_s: 0.002}`.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import TimeLimit


class SlowCartPole(gym.Wrapper):
    """CartPole-v1 (with its 500-step time limit) whose `step` first sleeps `step_s` seconds.

    Built from `CartPoleEnv` and `TimeLimit` rather than `gym.make("CartPole-v1")`: the outer
    `gym.make` of this env already adds the checking wrappers, and a second set would only add
    CPU per step, the very cost the scaling bench is about."""

    def __init__(self, step_s: float = 0.002, **kwargs: Any) -> None:
        if step_s < 0:
            raise ValueError(f"step_s={step_s}: must be >= 0")
        limit = gym.spec("CartPole-v1").max_episode_steps
        super().__init__(TimeLimit(CartPoleEnv(**kwargs), max_episode_steps=limit))
        self.step_s = step_s

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        time.sleep(self.step_s)
        return self.env.step(action)
