"""Stepping a vector env with a policy and cutting the stream into chunks.

No HTTP and no storage here: the collector service and the single-process runner both drive
this loop, which is what makes their throughput comparable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from shared.core import Policy
from shared.envs import final_next_obs


@dataclass
class Chunk:
    arrays: dict[str, np.ndarray]
    policy_version: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.arrays["reward"].shape[0])


def episode_segments(done: np.ndarray) -> list[tuple[int, int]]:
    """(start row, length) runs of one episode in an env-major chunk, from done flags of
    shape (T, n): env i owns rows i*T .. i*T+T-1 and a run ends after every done step."""
    T, n = done.shape
    segments = []
    for i in range(n):
        start = 0
        for t in np.flatnonzero(done[:, i]).tolist():
            segments.append((i * T + start, t + 1 - start))
            start = t + 1
        if start < T:
            segments.append((i * T + start, T - start))
    return segments


class Rollout:
    """A chunk holds `chunk_size` transitions (rounded up to whole vector steps), stored
    env-major: each env's steps are contiguous rows, so an episode is a run of rows."""

    def __init__(self, envs: gym.vector.VectorEnv, policy: Policy, chunk_size: int) -> None:
        self.envs = envs
        self.policy = policy
        self.n = envs.num_envs
        self.steps_per_chunk = max(1, -(-chunk_size // self.n))
        self.obs, _ = envs.reset()
        self.ep_return = np.zeros(self.n, dtype=np.float64)
        self.ep_length = np.zeros(self.n, dtype=np.int64)
        self.env_steps = 0

    def collect(self, epsilon: float) -> Chunk:
        """Run `steps_per_chunk` vector steps and return them as one chunk."""
        T, n = self.steps_per_chunk, self.n
        obs_buf = np.empty((T, n, *self.obs.shape[1:]), dtype=np.float32)
        next_buf = np.empty_like(obs_buf)
        act_buf = np.empty((T, n), dtype=np.int64)
        rew_buf = np.empty((T, n), dtype=np.float32)
        term_buf = np.empty((T, n), dtype=bool)
        trunc_buf = np.empty((T, n), dtype=bool)
        returns: list[float] = []
        lengths: list[int] = []
        version = self.policy.version
        for t in range(T):
            actions = self.policy.act(self.obs, epsilon)
            next_obs, reward, terminated, truncated, info = self.envs.step(actions)
            done = terminated | truncated
            obs_buf[t] = self.obs
            next_buf[t] = final_next_obs(next_obs, info, done)
            act_buf[t] = actions
            rew_buf[t] = reward
            term_buf[t] = terminated
            trunc_buf[t] = truncated
            self.ep_return += reward
            self.ep_length += 1
            for i in np.flatnonzero(done):
                returns.append(float(self.ep_return[i]))
                lengths.append(int(self.ep_length[i]))
                self.ep_return[i] = 0.0
                self.ep_length[i] = 0
            self.obs = next_obs
        self.env_steps += T * n
        # Env-major rows: each env's T steps are contiguous, so episodes are runs of rows.
        def env_major(buf: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(buf.swapaxes(0, 1)).reshape(T * n, *buf.shape[2:])

        arrays = {"obs": env_major(obs_buf), "action": env_major(act_buf),
                  "reward": env_major(rew_buf), "next_obs": env_major(next_buf),
                  "terminated": env_major(term_buf), "truncated": env_major(trunc_buf)}
        segments = episode_segments(term_buf | trunc_buf)
        return Chunk(arrays, version, returns, lengths, segments)


def evaluate(envs: gym.vector.VectorEnv, policy: Policy, episodes: int,
             seed: int) -> tuple[list[float], list[int]]:
    """Run exactly `episodes` deterministic episodes spread evenly over the envs (env i runs
    episodes i, i+n, ...), so short episodes cannot crowd out long ones in the mean."""
    n = envs.num_envs
    quota = np.array([episodes // n + (1 if i < episodes % n else 0) for i in range(n)])
    obs, _ = envs.reset(seed=seed)
    ep_return = np.zeros(n)
    ep_length = np.zeros(n, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    while (quota > 0).any():
        next_obs, reward, terminated, truncated, _ = envs.step(policy.act_eval(obs))
        active = quota > 0
        ep_return += np.where(active, reward, 0.0)
        ep_length += active
        for i in np.flatnonzero((terminated | truncated) & active):
            returns.append(float(ep_return[i]))
            lengths.append(int(ep_length[i]))
            quota[i] -= 1
            ep_return[i] = 0.0
            ep_length[i] = 0
        obs = next_obs
    return returns, lengths
