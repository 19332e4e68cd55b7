"""Stepping a vector env with a policy and cutting the stream into chunks.

Two ways to cut (`collector.mode`):
- *samples*: `chunk_size` transitions (rounded up to whole vector steps), stored env-major:
  each env's steps are contiguous rows, so an episode is a run of rows and a chunk may start
  or stop mid-episode;
- *episodes*: `episodes_per_chunk` whole episodes, each a contiguous run of rows; an episode
  is never split over two chunks nor mixed with another.

Every chunk has the fields of `rlfleet.shared.algos.base.BASE_FIELDS` (`cut` marks the last row of
each run), the policy's extras, and `bootstrap_value` for policies that bootstrap cut runs.
No HTTP and no storage here: the collector service and the single-process runner both drive
this loop, which is what makes their throughput comparable.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from rlfleet.shared.algos.base import ActOutput, Policy
from rlfleet.shared.algos.capabilities import NormalizesObservations, Recurrent, SeededActing
from rlfleet.shared.contract.wire.evaluation import success_rate
from rlfleet.shared.contract.wire.tasks import GameRecord
from rlfleet.shared.envs.goals import episode_info, episode_success
from rlfleet.shared.envs.make import final_next_obs, reward_components
from rlfleet.shared.util.moments import RunningMoments


@dataclass
class Chunk:
    arrays: dict[str, np.ndarray]
    policy_version: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    timers: dict[str, float] = field(default_factory=dict)  # ms per vector step, by phase
    episode_return_components: list[list[float]] = field(default_factory=list)
    episode_envs: list[int] = field(default_factory=list)  # the env each episode ran in
    games: list[GameRecord] = field(default_factory=list)  # self-play: games that ended here
    opponents_skipped: list[str] = field(default_factory=list)
    obs_moments: RunningMoments | None = None  # algo.obs_norm: raw observations acted on

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


def _as_stored(value: np.ndarray) -> np.ndarray:
    """float64 from envs and numpy becomes float32: chunks are half the size, and torch
    trains in float32 anyway."""
    value = np.asarray(value)
    return value.astype(np.float32) if value.dtype == np.float64 else value


class Actor(Protocol):
    """What a rollout calls on whatever acts in it: a run's `Policy`, or what a collector
    acts with before torch has loaded (uniform random actions, version -1)."""

    @property
    def version(self) -> int: ...

    def act(self, obs: np.ndarray, env_step: int) -> ActOutput: ...

    def bootstrap(self, obs: np.ndarray) -> np.ndarray | None: ...


class Rollout:
    def __init__(self, envs: gym.vector.VectorEnv, policy: Actor, chunk_size: int = 256,
                 mode: str = "samples", episodes_per_chunk: int = 4) -> None:
        if mode not in ("samples", "episodes"):
            raise ValueError(f"collector.mode={mode!r}: expected 'samples' or 'episodes'")
        self.envs = envs
        self.mode = mode
        self.n = envs.num_envs
        self.steps_per_chunk = max(1, -(-chunk_size // self.n))
        self.episodes_per_chunk = episodes_per_chunk
        self.obs, _ = envs.reset()
        self.ep_return = np.zeros(self.n, dtype=np.float64)
        self.ep_length = np.zeros(self.n, dtype=np.int64)
        self.ep_components: np.ndarray | None = None  # vector-reward envs: (n, k) so far
        self.finished_components: list[list[float]] = []
        self.finished_envs: list[int] = []  # env index of each finished episode, in order
        self.env_steps = 0
        self.policy = policy  # after self.obs: the setter sizes the moments by it
        self.bootstraps = policy.bootstrap(self.pre(self.obs[:1])) is not None
        # episodes mode: recent vector steps (one dict of (n, ...) arrays each), the absolute
        # index of the first one, each env's episode start, and finished episodes waiting.
        self._steps: list[dict[str, np.ndarray]] = []
        self._versions: list[int] = []
        self._base = 0
        self._start = np.zeros(self.n, dtype=np.int64)
        self._done_eps: list[tuple[dict[str, np.ndarray], float, int, int]] = []
        self._clock = {"inference": 0.0, "env_step": 0.0}
        self._clock_steps = 0

    @property
    def policy(self) -> Actor:
        return self._policy

    @policy.setter
    def policy(self, policy: Actor) -> None:
        """A policy swap (a collector's random warm-up ending) re-reads what it asks for:
        algo.obs_norm acts on (and stores) normalised observations and counts the raw ones."""
        self._policy = policy
        # A recurrent policy's memory of the episodes under way starts empty (Recurrent).
        self._recurrent = policy if isinstance(policy, Recurrent) else None
        if self._recurrent is not None:
            self._recurrent.reset_state(None)
        normalizes = policy if isinstance(policy, NormalizesObservations) else None
        self._pre = normalizes.preprocess if normalizes is not None else None
        self._moments = (RunningMoments.empty(self.obs.shape[1:])
                         if normalizes is not None and normalizes.tracks_obs_stats else None)

    def pre(self, obs: np.ndarray) -> np.ndarray:
        return obs if self._pre is None else self._pre(obs)

    def take_moments(self) -> RunningMoments | None:
        """The raw observations' moments since the last chunk (then counting afresh)."""
        if self._moments is None:
            return None
        out = self._moments
        self._moments = RunningMoments.empty(out.mean.shape)
        return out

    def _take_timers(self) -> dict[str, float]:
        """ms per vector step spent acting and stepping envs since the last chunk."""
        n = max(1, self._clock_steps)
        out = {f"{k}_ms": 1000.0 * v / n for k, v in self._clock.items()}
        out["vector_steps"] = float(n)  # the adder spreads its write time over these
        self._clock = dict.fromkeys(self._clock, 0.0)
        self._clock_steps = 0
        return out

    def collect(self, env_step: int = 0) -> Chunk:
        """The next chunk; `env_step` is the run's global env step count (for exploration
        schedules)."""
        if self.mode == "episodes":
            return self._collect_episodes(env_step)
        return self._collect_samples(env_step)

    # -- one vector step --------------------------------------------------------------------

    def _step(self, env_step: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Act and step once; the step's fields (without `cut`) and its done flags."""
        t0 = time.perf_counter()
        obs = self.pre(self.obs)
        if self._moments is not None:
            self._moments.update(self.obs)
        out = self.policy.act(obs, env_step)
        t1 = time.perf_counter()
        next_obs, reward, terminated, truncated, info = self.envs.step(out.actions)
        self._clock["inference"] += t1 - t0
        self._clock["env_step"] += time.perf_counter() - t1
        self._clock_steps += 1
        done = terminated | truncated
        if self._recurrent is not None and done.any():  # these envs' next obs starts anew
            self._recurrent.reset_state(np.flatnonzero(done))
        real_next = self.pre(final_next_obs(next_obs, info, done))
        step = {"obs": _as_stored(obs), "action": _as_stored(out.actions),
                "reward": reward.astype(np.float32), "next_obs": _as_stored(real_next),
                "terminated": terminated.astype(bool), "truncated": truncated.astype(bool)}
        for key, value in out.extras.items():
            step[key] = _as_stored(value)
        if self.bootstraps:
            boot = np.zeros(self.n, dtype=np.float32)
            cut_alive = truncated & ~terminated  # the episode goes on past the time limit
            if cut_alive.any():
                idx = np.flatnonzero(cut_alive)
                boot[idx] = self.policy.bootstrap(real_next[idx])
            step["bootstrap_value"] = boot
        self.ep_return += reward
        self.ep_length += 1
        comps = reward_components(info, done)
        if comps is not None:
            if self.ep_components is None:
                self.ep_components = np.zeros_like(comps)
            self.ep_components += comps
        self.obs = next_obs
        self.env_steps += self.n
        return step, done

    def _finish(self, i: int) -> tuple[float, int]:
        ret, length = float(self.ep_return[i]), int(self.ep_length[i])
        self.finished_envs.append(int(i))
        self.ep_return[i] = 0.0
        self.ep_length[i] = 0
        if self.ep_components is not None:
            self.finished_components.append(self.ep_components[i].tolist())
            self.ep_components[i] = 0.0
        return ret, length

    def _take_components(self) -> list[list[float]]:
        out, self.finished_components = self.finished_components, []
        return out

    # -- samples mode -----------------------------------------------------------------------

    def _collect_samples(self, env_step: int) -> Chunk:
        T, n = self.steps_per_chunk, self.n
        bufs: dict[str, np.ndarray] = {}
        returns: list[float] = []
        lengths: list[int] = []
        done_buf = np.empty((T, n), dtype=bool)
        version = self.policy.version
        for t in range(T):
            step, done = self._step(env_step)
            for key, value in step.items():
                if key not in bufs:
                    bufs[key] = np.empty((T, *value.shape), dtype=value.dtype)
                bufs[key][t] = value
            done_buf[t] = done
            for i in np.flatnonzero(done).tolist():
                ret, length = self._finish(i)
                returns.append(ret)
                lengths.append(length)
        cut = done_buf.copy()
        cut[T - 1] = True
        bufs["cut"] = cut
        if self.bootstraps:  # runs cut by the chunk's end continue from the current obs
            alive = np.flatnonzero(~done_buf[T - 1])
            if alive.size:
                bufs["bootstrap_value"][T - 1, alive] = self.policy.bootstrap(
                    self.pre(self.obs[alive]))

        # Env-major rows: each env's T steps are contiguous, so episodes are runs of rows.
        def env_major(buf: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(buf.swapaxes(0, 1)).reshape(T * n, *buf.shape[2:])

        arrays = {key: env_major(buf) for key, buf in bufs.items()}
        envs, self.finished_envs = self.finished_envs, []
        return Chunk(arrays, version, returns, lengths, episode_segments(done_buf),
                     self._take_timers(), self._take_components(),
                     obs_moments=self.take_moments(), episode_envs=envs)

    # -- episodes mode ----------------------------------------------------------------------

    def _collect_episodes(self, env_step: int) -> Chunk:
        while len(self._done_eps) < self.episodes_per_chunk:
            step, done = self._step(env_step)
            self._steps.append(step)
            self._versions.append(self.policy.version)
            now = self._base + len(self._steps) - 1
            for i in np.flatnonzero(done).tolist():
                self._done_eps.append(self._extract(i, now))
            self._trim()
        episodes = self._done_eps[:self.episodes_per_chunk]
        del self._done_eps[:self.episodes_per_chunk]
        arrays = {key: np.concatenate([ep[0][key] for ep in episodes])
                  for key in episodes[0][0]}
        segments, row = [], 0
        for _, _, length, _ in episodes:
            segments.append((row, length))
            row += length
        # finished_components is filled in the order episodes finish, like _done_eps
        comps = self.finished_components[:len(episodes)]
        del self.finished_components[:len(episodes)]
        envs = self.finished_envs[:len(episodes)]
        del self.finished_envs[:len(episodes)]
        return Chunk(arrays, min(ep[3] for ep in episodes), [ep[1] for ep in episodes],
                     [ep[2] for ep in episodes], segments, self._take_timers(), comps,
                     obs_moments=self.take_moments(), episode_envs=envs)

    def _extract(self, i: int, last: int) -> tuple[dict[str, np.ndarray], float, int, int]:
        """Env i's episode that ended at absolute step `last`: (rows, return, length, oldest
        policy version that acted in it)."""
        first = int(self._start[i])
        window = self._steps[first - self._base:last - self._base + 1]
        rows = {key: np.stack([s[key] for s in window])[:, i] for key in window[0]}
        cut = np.zeros(len(window), dtype=bool)
        cut[-1] = True
        rows["cut"] = cut
        version = min(self._versions[first - self._base:last - self._base + 1])
        ret, length = self._finish(i)
        self._start[i] = last + 1
        return rows, ret, length, version

    def _trim(self) -> None:
        """Forget vector steps no unfinished episode needs."""
        drop = int(self._start.min()) - self._base
        if drop > 0:
            del self._steps[:drop]
            del self._versions[:drop]
            self._base += drop


class Evaluated(NamedTuple):
    """Evaluation episodes in the order they finished: return, length, whether each
    reached its goal (None where the env reports no `info["is_success"]`), and whether each
    was cut short (by the env's time limit or the evaluation's step cap) instead of
    terminating."""

    returns: list[float]
    lengths: list[int]
    successes: list[bool | None]
    truncated: list[bool]
    infos: dict[str, list[float | None]] = {}  # eval.info_keys: each episode's final value

    @property
    def success_rate(self) -> float | None:
        return success_rate(self.successes)


def evaluate(envs: gym.vector.VectorEnv, policy: Policy, episodes: int, seed: int,
             deterministic: bool = True, max_steps: int | None = None,
             info_keys: tuple[str, ...] = (), return_key: str | None = None) -> Evaluated:
    """Run exactly `episodes` episodes spread evenly over the envs (env i runs episodes i,
    i+n, ...), so short episodes cannot crowd out long ones in the mean (the bias of
    counting whichever episodes finish first). Its random draws come from `seed`, not from
    the acting streams (`_own_randomness`).

    An episode still running after `max_steps` env steps (`eval.max_steps`) ends there as
    truncated and its env is reset alone: an env without a time limit, or a policy that
    never ends an episode, would otherwise hold the caller's thread for good.

    `info_keys` (`eval.info_keys`): numbers each episode's final step reports in its info,
    kept per episode. `return_key` (`eval.episode_return_key`): an episode's return is what
    its final info says there (an env or wrapper that knows the true score, under clipped or
    shaped rewards), the sum of rewards where it says nothing."""
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"eval.max_steps={max_steps}: expected a positive step count or null")
    with _own_randomness(policy, seed):
        return _evaluate(envs, policy, episodes, seed, deterministic, max_steps,
                         tuple(info_keys), return_key)


@contextlib.contextmanager
def _own_randomness(policy: Policy, seed: int) -> Iterator[None]:
    """Evaluation draws from generators seeded with its own seed, and leaves the policy's
    (`SeededActing.rng`, numpy) and torch's global generator as it found them.

    Why: a stochastic evaluation that drew its exploration from the stream the policy acts
    with would make how often a run is evaluated change what it then collects and learns
    (bench/RESULTS.md has CartPole DQN's env steps to solve with and without it), and its
    figures could not be reproduced from the evaluation's seed."""
    gen = policy.rng if isinstance(policy, SeededActing) else None
    saved = None
    if isinstance(gen, np.random.Generator):
        saved = gen.bit_generator.state
        gen.bit_generator.state = type(gen.bit_generator)(seed).state
    torch = sys.modules.get("torch")  # a policy that samples with torch has loaded it
    try:
        if torch is None:
            yield
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                yield
    finally:
        if gen is not None and saved is not None:
            gen.bit_generator.state = saved


def _evaluate(envs: gym.vector.VectorEnv, policy: Policy, episodes: int, seed: int,
              deterministic: bool, max_steps: int | None, info_keys: tuple[str, ...],
              return_key: str | None) -> Evaluated:
    n = envs.num_envs
    quota = np.array([episodes // n + (1 if i < episodes % n else 0) for i in range(n)])
    obs, _ = envs.reset(seed=seed)
    ep_return = np.zeros(n)
    ep_length = np.zeros(n, dtype=np.int64)
    out = Evaluated([], [], [], [], {key: [] for key in info_keys})
    # algo.obs_norm: the version's statistics
    pre = policy.preprocess if isinstance(policy, NormalizesObservations) else None
    recurrent = policy if isinstance(policy, Recurrent) else None
    if recurrent is not None:  # evaluation's own memory, empty as its episodes start
        recurrent.reset_state(None, evaluation=True)
    while (quota > 0).any():
        actions = policy.act_eval(obs if pre is None else pre(obs), deterministic)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        active = quota > 0
        done = terminated | truncated
        ep_return += np.where(active, reward, 0.0)
        ep_length += active
        # at the cap: the episode ends here, and its env starts the next one now (the others
        # go on with theirs)
        capped = (active & ~done & (ep_length >= max_steps) if max_steps is not None
                  else np.zeros(n, dtype=bool))
        if capped.any():
            next_obs, _ = envs.reset(options={"reset_mask": capped.copy()})
        if recurrent is not None and (done | capped).any():
            recurrent.reset_state(np.flatnonzero(done | capped), evaluation=True)
        for i in np.flatnonzero((done | capped) & active).tolist():
            reported = episode_info(info, i, return_key) if return_key else None
            out.returns.append(float(ep_return[i]) if reported is None else reported)
            for key in info_keys:
                out.infos[key].append(episode_info(info, i, key))
            out.lengths.append(int(ep_length[i]))
            out.successes.append(episode_success(info, i))
            out.truncated.append(not bool(terminated[i]))
            quota[i] -= 1
            ep_return[i] = 0.0
            ep_length[i] = 0
        obs = next_obs
    return out
