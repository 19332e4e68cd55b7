"""Environment construction shared by collectors, evaluators and the single-process runner."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from shared.config import EnvConfig


@dataclass(frozen=True)
class EnvSpec:
    """What a policy needs to know about an environment to be built."""

    obs_shape: tuple[int, ...]
    n_actions: int


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets finished envs in the same step and reports their
    final observation in `info["final_obs"]` (so no transition is lost or faked).

    Synchronous because CartPole-sized envs step in microseconds: worker processes would cost
    more in pickling and pipes than they save; collectors scale out as processes instead.
    """
    envs = gym.make_vec(cfg.id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        **cfg.kwargs)
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs


def env_spec(cfg: EnvConfig) -> EnvSpec:
    env = gym.make(cfg.id, **cfg.kwargs)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"env.id={cfg.id!r} has action space {act_space}; DQN needs Discrete")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"env.id={cfg.id!r} has observation space {obs_space}; expected Box")
    return EnvSpec(obs_shape=tuple(obs_space.shape), n_actions=int(act_space.n))


def final_next_obs(next_obs: np.ndarray, info: dict, done: np.ndarray) -> np.ndarray:
    """The true next observation of each env: the final one where an episode just ended."""
    if not done.any():
        return next_obs
    out = next_obs.copy()
    final = info["final_obs"]
    for i in np.flatnonzero(done):
        out[i] = final[i]
    return out
