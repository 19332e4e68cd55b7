"""Environment construction shared by collectors, evaluators and the single-process runner.

`env.id` is a gymnasium id, or an import path `package.module:attr` naming an `Env` class
or a factory returning one; such an env is registered with gymnasium under that path the
first time it is used, so vector envs and wrappers treat it like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from shared.config import EnvConfig


@dataclass(frozen=True)
class EnvSpec:
    """What a policy needs to know about an environment to be built."""

    obs_shape: tuple[int, ...]
    n_actions: int = 0                    # discrete: number of actions; 0 when continuous
    action_shape: tuple[int, ...] = ()    # continuous: shape of one action
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def discrete(self) -> bool:
        return self.n_actions > 0


def resolve_env_id(env_id: str) -> str:
    """`env_id` itself, after registering it with gymnasium when it is an import path."""
    if ":" not in env_id:
        return env_id
    # gymnasium reads "module:Name" as "import module, then make registered Name": the path
    # is registered under a colon-free id instead.
    registered = "user." + env_id.replace(":", ".")
    if registered in gym.registry:
        return registered
    from shared.algos.base import load_object  # imports the user's module, errors named

    entry = load_object(env_id, "env.id")
    if not callable(entry):
        raise ValueError(f"env.id={env_id!r} names {type(entry).__name__}, not an Env class "
                         "or factory")
    gym.register(id=registered, entry_point=entry)
    return registered


class ScalarizeReward(gym.Wrapper):
    """For vector-reward (multi-objective) envs: the reward becomes `weights . reward` and
    the vector goes to `info["reward_components"]`, so collectors can log each component
    while algorithms see an ordinary scalar."""

    def __init__(self, env: gym.Env, weights: tuple[float, ...]) -> None:
        super().__init__(env)
        self.weights = np.asarray(weights, dtype=np.float64)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        vec = np.asarray(reward, dtype=np.float64).reshape(-1)
        if vec.shape != self.weights.shape:
            raise ValueError(f"env.reward_weights has {self.weights.size} weights but the env "
                             f"returned a reward of {vec.size} components")
        return obs, float(vec @ self.weights), terminated, truncated, {
            **info, "reward_components": vec}


def reward_components(info: dict, done: np.ndarray) -> np.ndarray | None:
    """Each env's reward vector of this step (n, k), or None when the env has none. Envs that
    just reset report theirs in `final_info` (same-step autoreset)."""
    comps = info.get("reward_components")
    final_info = info.get("final_info") or {}
    final = final_info.get("reward_components")
    if comps is None and final is None:
        return None
    out = np.array(comps if comps is not None else np.zeros_like(final), dtype=np.float64)
    if final is not None:
        mask = final_info.get("_reward_components", done)
        out[mask] = final[mask]
    return out


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets finished envs in the same step and reports their
    final observation in `info["final_obs"]` (so no transition is lost or faked). Continuous
    actions are clipped to the action space by the env, so policies store what they sampled.

    Synchronous because CartPole-sized envs step in microseconds: worker processes would cost
    more in pickling and pipes than they save; collectors scale out as processes instead.
    """
    weights = cfg.reward_weights
    wrappers = [lambda env: ScalarizeReward(env, weights)] if weights else None
    envs = gym.make_vec(resolve_env_id(cfg.id), num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        wrappers=wrappers, **cfg.kwargs)
    if isinstance(envs.single_action_space, gym.spaces.Box):
        envs = gym.wrappers.vector.ClipAction(envs)
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs


def env_spec(cfg: EnvConfig) -> EnvSpec:
    env = gym.make(resolve_env_id(cfg.id), **cfg.kwargs)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"env.id={cfg.id!r} has observation space {obs_space}; expected Box")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape=tuple(obs_space.shape), n_actions=int(act_space.n))
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(obs_shape=tuple(obs_space.shape), action_shape=tuple(act_space.shape),
                       action_low=tuple(float(x) for x in act_space.low.ravel()),
                       action_high=tuple(float(x) for x in act_space.high.ravel()))
    raise ValueError(f"env.id={cfg.id!r} has action space {act_space}; expected Discrete or "
                     "Box")


def run_spec(cfg: Any) -> EnvSpec:
    """The spec of a run's env (a `RunConfig`): under a league, one side's view of the
    two-player game."""
    if getattr(cfg, "league", None) is not None:
        from shared.games.match import game_spec

        return game_spec(cfg.env.id, cfg.env.kwargs)
    return env_spec(cfg.env)


def final_next_obs(next_obs: np.ndarray, info: dict, done: np.ndarray) -> np.ndarray:
    """The true next observation of each env: the final one where an episode just ended."""
    if not done.any():
        return next_obs
    out = next_obs.copy()
    final = info["final_obs"]
    for i in np.flatnonzero(done):
        out[i] = final[i]
    return out
