"""Environment construction shared by collectors, evaluators and the single-process runner.

`env.id` is a gymnasium id, or an import path `package.module:attr` naming an `Env` class
or a factory returning one; such an env is registered with gymnasium under that path the
first time it is used, so vector envs and wrappers treat it like any other.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from rlfleet.shared.contract.config import AtariConfig, EnvConfig
from rlfleet.shared.contract.plugins import PluginKind, load_plugin
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.goals import FlattenGoalObs, is_goal_space

# The project's own envs, made by id like gymnasium's (`env.id: rlfleet/BitFlip-v0`).
if "rlfleet/BitFlip-v0" not in gym.registry:
    gym.register("rlfleet/BitFlip-v0", entry_point="rlfleet.shared.envs.bitflip:BitFlipEnv")
if "rlfleet/Corridor-v0" not in gym.registry:
    gym.register("rlfleet/Corridor-v0", entry_point="rlfleet.shared.envs.corridor:CorridorEnv")
if "rlfleet/CartPoleNoVel-v0" not in gym.registry:
    gym.register("rlfleet/CartPoleNoVel-v0",
                 entry_point="rlfleet.shared.envs.pomdp:CartPoleNoVelEnv",
                 max_episode_steps=500, reward_threshold=475.0)


# A user's env by import path: an `Env` class or a function that makes one.
ENV = PluginKind("env", callable_ok=True)


def resolve_env_id(env_id: str) -> str:
    """`env_id` itself, after registering it with gymnasium when it is an import path."""
    if ":" not in env_id:
        return env_id
    # gymnasium reads "module:Name" as "import module, then make registered Name": the path
    # is registered under a colon-free id instead.
    registered = "user." + env_id.replace(":", ".")
    if registered in gym.registry:
        return registered
    load_plugin(env_id, "env.id", ENV)  # a ConfigError naming the field, or an env
    # by its path, not the object: an env spec with a callable cannot be saved (a Minari
    # dataset exported from the run stores its env's spec)
    gym.register(id=registered, entry_point=env_id)
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


def _ale() -> None:
    """Register the ALE's games with gymnasium, importing ale-py only for Atari runs."""
    try:
        import ale_py
    except ImportError:
        raise ValueError("env.atari needs ale-py: install the atari extra "
                         "(pip install -e '.[atari]')") from None
    gym.register_envs(ale_py)


def make_atari(env_id: str, atari: AtariConfig, kwargs: dict[str, Any] | None = None
               ) -> gym.Env:
    """One ALE game with gymnasium's standard preprocessing: the emulator steps every frame
    and `AtariPreprocessing` skips and max-pools, resizes to grayscale 84x84 and does the
    reset no-ops; `FrameStackObservation` stacks the last frames, padding a fresh episode
    with its first frame. Observations stay uint8 (stack, side, side[, 3]): collectors store
    each frame once and the network scales them to floats on the learner's device."""
    _ale()
    env = gym.make(env_id, frameskip=1, repeat_action_probability=atari.repeat_action_probability,
                   full_action_space=atari.full_action_space,
                   max_num_frames_per_episode=atari.max_episode_frames or 0,
                   **(kwargs or {}))
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=atari.noop_max, frame_skip=atari.frame_skip,
        screen_size=atari.screen_size, terminal_on_life_loss=atari.terminal_on_life_loss,
        grayscale_obs=atari.grayscale, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, stack_size=atari.frame_stack)


def _make_one(cfg: EnvConfig, render_mode: str | None = None,
              render_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One env of a vector env (a module-level function: `async` workers may pickle it);
    `render_mode="rgb_array"` (and `eval.video.render_kwargs`) for one that records videos."""
    kwargs = {**cfg.kwargs, **(render_kwargs or {}),
              **({"render_mode": render_mode} if render_mode else {})}
    if cfg.atari is not None:
        env = make_atari(cfg.id, cfg.atari, kwargs)
    else:
        env = gym.make(resolve_env_id(cfg.id), **kwargs)
    if cfg.reward_weights:
        env = ScalarizeReward(env, cfg.reward_weights)
    if is_goal_space(env.observation_space):  # Dict(observation, achieved/desired_goal)
        env = FlattenGoalObs(env)
    return env


def make_render_env(cfg: EnvConfig, render_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One env as the collectors' envs are made, rendering `rgb_array` frames (videos), with
    `render_kwargs` on top of `env.kwargs` (a frame size, a camera)."""
    env = _make_one(cfg, render_mode="rgb_array", render_kwargs=render_kwargs)
    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.ClipAction(env)
    return env


def goal_functions(cfg: EnvConfig) -> tuple[Any, Any]:
    """A goal-conditioned env's vectorised `compute_reward(achieved_goal, desired_goal,
    info)` and `compute_terminated` (None when it has none), from one env made here and kept
    for them."""
    env = _make_one(cfg)
    if not isinstance(env, FlattenGoalObs):
        env.close()
        raise ValueError(f"env.id={cfg.id!r} is not goal-conditioned")
    inner = env.unwrapped
    if not isinstance(inner, ComputesReward):
        env.close()
        raise ValueError(f"env.id={cfg.id!r} has no compute_reward(achieved_goal, "
                         "desired_goal, info)")
    return inner.compute_reward, (inner.compute_terminated
                                  if isinstance(inner, ComputesTerminated) else None)


@runtime_checkable
class ComputesReward(Protocol):
    """A goal-conditioned env's reward of any goal (gymnasium-robotics' `GoalEnv`)."""

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any) -> Any: ...


@runtime_checkable
class ComputesTerminated(Protocol):
    """... and, optionally, whether a goal ends the episode."""

    def compute_terminated(self, achieved_goal: Any, desired_goal: Any, info: Any) -> Any: ...


class LevelSeed(gym.Wrapper):
    """An env that resets with one seed at every episode: it replays one level of a
    procedurally generated env (a task's `level_seeds`)."""

    def __init__(self, env: gym.Env, level_seed: int) -> None:
        super().__init__(env)
        self.level_seed = level_seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self.env.reset(seed=self.level_seed, options=options)


def _make_level(cfg: EnvConfig, level_seed: int) -> gym.Env:
    return LevelSeed(_make_one(cfg), level_seed)


def with_step_cap(cfg: EnvConfig, max_steps: int | None) -> EnvConfig:
    """`cfg` whose episodes end, truncated, after at most `max_steps` steps (gymnasium's own
    TimeLimit, through `gym.make`'s `max_episode_steps`), keeping a shorter limit the env
    registered: what plays or rolls out a policy outside an evaluation (`rlfleet play`,
    `rlfleet export`) cannot hang on an env that never ends. None, and EnvPool's envs (their
    limits are their own), leave it as it is."""
    if max_steps is None or cfg.backend == "envpool":
        return cfg
    try:
        registered = gym.spec(resolve_env_id(cfg.id)).max_episode_steps
    except gym.error.Error:  # not registered under that id: made from its import path
        registered = None
    limit = max_steps if registered is None else min(registered, max_steps)
    return with_env_kwargs(cfg, {"max_episode_steps": limit})


def with_env_kwargs(cfg: EnvConfig, env_kwargs: dict[str, Any]) -> EnvConfig:
    """`cfg` with `env_kwargs` on top of its `kwargs` (a task's env settings)."""
    return cfg.model_copy(update={"kwargs": {**cfg.kwargs, **env_kwargs}}) if env_kwargs \
        else cfg


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int,
                    level_seeds: list[int] | None = None) -> gym.vector.VectorEnv:
    """A vector env that resets finished envs in the same step and reports their final
    observation in `info["final_obs"]` (so no transition is lost or faked). Continuous
    actions are clipped to the action space by the env, so policies store what they sampled.

    `env.backend: sync` (the default) steps the envs in the collector's process: CartPole-sized
    envs step in microseconds, and worker processes would cost more in pickling and pipes
    than they save (collectors scale out as processes instead). `async` steps each env in a
    subprocess of its own, for envs slow enough that stepping them in parallel pays;
    `envpool` steps the batch in EnvPool's C++ threads (`shared/envs/envpool_vec.py`).

    `level_seeds`: env i resets with `level_seeds[i % len]` at every episode (`LevelSeed`).
    """
    same_step = gym.vector.AutoresetMode.SAME_STEP
    fns = [partial(_make_one, cfg) for _ in range(num_envs)]
    if level_seeds:
        if cfg.backend == "envpool":
            raise ValueError("level seeds need env.backend sync or async, not envpool")
        fns = [partial(_make_level, cfg, level_seeds[i % len(level_seeds)])
               for i in range(num_envs)]
    if cfg.backend == "envpool":
        from rlfleet.shared.envs.envpool_vec import EnvPoolVector

        envs: gym.vector.VectorEnv = EnvPoolVector(cfg, num_envs, seed)
    elif cfg.atari is None:
        resolve_env_id(cfg.id)  # registers an import path before workers are made
    else:
        _ale()
    if cfg.backend == "async":
        envs = gym.vector.AsyncVectorEnv(fns, shared_memory=True, autoreset_mode=same_step)
    elif cfg.backend == "sync":
        envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=same_step)
    if isinstance(envs.single_action_space, gym.spaces.Box):
        envs = gym.wrappers.vector.ClipAction(envs)
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs


def env_spec(cfg: EnvConfig) -> EnvSpec:
    if cfg.backend == "envpool":  # from EnvPool itself (a missing package: ConfigError)
        from rlfleet.shared.envs.envpool_vec import EnvPoolVector

        pool = EnvPoolVector(cfg, 1, 0)
        obs_space, act_space = pool.single_observation_space, pool.single_action_space
        pool.close()
        goal = None
    else:
        env = _make_one(cfg)
        try:
            obs_space, act_space = env.observation_space, env.action_space
            goal = env.goal_layout if isinstance(env, FlattenGoalObs) else None
        finally:
            env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"env.id={cfg.id!r} has observation space {obs_space}; expected Box")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape=tuple(obs_space.shape), n_actions=int(act_space.n),
                       goal=goal)
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(obs_shape=tuple(obs_space.shape), action_shape=tuple(act_space.shape),
                       action_low=tuple(float(x) for x in act_space.low.ravel()),
                       action_high=tuple(float(x) for x in act_space.high.ravel()), goal=goal)
    raise ValueError(f"env.id={cfg.id!r} has action space {act_space}; expected Discrete or "
                     "Box")


def run_spec(cfg: Any) -> EnvSpec:
    """The spec of a run's env (a `RunConfig`): under a league, one side's view of the
    two-player game."""
    if cfg.league is not None:
        from rlfleet.shared.envs.games.match import game_spec

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
