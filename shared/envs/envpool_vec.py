"""EnvPool as a gymnasium vector env with same-step autoreset (`env.backend: envpool`).

EnvPool steps a whole batch of envs in C++ threads, the field's fastest executor for Atari
and MuJoCo. It resets a finished env on the *next* step (which then ignores its action),
while every rollout here expects gymnasium's same-step autoreset: the step that ends an
episode returns the next episode's first observation and reports the last one in
`info["final_obs"]`. This adapter resets finished envs at once, by id, and reports their
final observations, so the rollout, the frame packing and evaluation see what they see with
the other backends. Atari settings map onto EnvPool's own preprocessing (`atari_options`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.shared.contract.config import AtariConfig, ConfigError, EnvConfig


def _envpool():
    try:
        import envpool
    except ImportError:
        raise ConfigError("env.backend='envpool' needs the envpool package: install the "
                          "envpool extra (pip install -e '.[envpool]')") from None
    return envpool


def task_id(cfg: EnvConfig) -> str:
    """EnvPool's name for the env (`ALE/Pong-v5` is `Pong-v5` there); a clear error for an
    env it does not have."""
    envpool = _envpool()
    name = cfg.id.removeprefix("ALE/")
    if name not in envpool.list_all_envs():
        raise ConfigError(f"env.backend='envpool': EnvPool has no env {name!r} (env.id="
                          f"{cfg.id!r}); see envpool.list_all_envs()")
    return name


def atari_options(atari: AtariConfig) -> dict[str, Any]:
    """The protocol's settings in EnvPool's words. No FIRE on reset and no reward clipping,
    as with gymnasium's AtariPreprocessing."""
    frames = atari.max_episode_frames
    return {"stack_num": atari.frame_stack, "frame_skip": atari.frame_skip,
            "noop_max": atari.noop_max, "episodic_life": atari.terminal_on_life_loss,
            "reward_clip": False, "use_fire_reset": False,
            "repeat_action_probability": atari.repeat_action_probability,
            "img_height": atari.screen_size, "img_width": atari.screen_size,
            "gray_scale": atari.grayscale, "full_action_space": atari.full_action_space,
            **({"max_episode_steps": max(1, frames // atari.frame_skip)} if frames else {})}


class EnvPoolVector(gym.vector.VectorEnv):
    """`num_envs` EnvPool envs behind gymnasium's vector API, same-step autoreset. EnvPool
    seeds its envs when it is made: `reset(seed=...)` later does not reseed them."""

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        envpool = _envpool()
        options = dict(cfg.kwargs)
        if cfg.atari is not None:
            options |= atari_options(cfg.atari)
        self.pool = envpool.make(task_id(cfg), env_type="gymnasium", num_envs=num_envs,
                                 seed=seed, **options)
        self.num_envs = num_envs
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self._obs: np.ndarray | None = None  # the last observations handed out

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Every env, or (gymnasium's `options={"reset_mask": mask}`) only the masked ones,
        the others keeping the episodes they are in: an evaluation cuts one env's episode
        at its step cap this way."""
        mask = (options or {}).get("reset_mask")
        if mask is None or self._obs is None:
            obs, _ = self.pool.reset()
        else:
            fresh, got = self.pool.reset(np.flatnonzero(mask))
            obs = self._obs.copy()
            obs[np.asarray(got["env_id"])] = fresh
        self._obs = obs
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 np.ndarray, dict]:
        obs, reward, terminated, truncated, got = self.pool.step(np.asarray(actions))
        order = np.asarray(got["env_id"])
        if not np.array_equal(order, np.arange(self.num_envs)):  # rows by env id
            back = np.argsort(order)
            obs, reward = obs[back], reward[back]
            terminated, truncated = terminated[back], truncated[back]
        done = terminated | truncated
        info: dict[str, Any] = {}
        if done.any():
            ids = np.flatnonzero(done)
            final = obs.copy()  # rows of envs still running are never read
            info = {"final_obs": final, "_final_obs": done.copy()}
            fresh, again = self.pool.reset(ids)
            obs = obs.copy()
            obs[np.asarray(again["env_id"])] = fresh
        self._obs = obs
        return obs, reward.astype(np.float64), terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        self.pool.close()
