"""The scaling bench's slow env: each step takes at least its `step_s`, and a config can name
it by import path like any user env."""

from __future__ import annotations

import time

import numpy as np

from bench.slow_env import SlowCartPole
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.envs.make import make_vector_env


def test_step_takes_at_least_step_s() -> None:
    env = SlowCartPole(step_s=0.005)
    env.reset(seed=0)
    steps = 4
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(0)
        assert not (terminated or truncated)  # 4 pushes left cannot end an episode
    assert time.perf_counter() - t0 >= steps * 0.005
    env.close()


def test_loadable_by_import_path_in_a_vector_env() -> None:
    envs = make_vector_env(EnvConfig(id="bench.slow_env:SlowCartPole",
                                     kwargs={"step_s": 0.001}), 2, 0)
    try:
        assert envs.num_envs == 2
        t0 = time.perf_counter()
        obs, reward, _, _, _ = envs.step(np.zeros(2, dtype=np.int64))
        # a synchronous vector env steps its envs one after the other
        assert time.perf_counter() - t0 >= 2 * 0.001
        assert obs.shape == (2, 4)
        assert reward.shape == (2,)
    finally:
        envs.close()
