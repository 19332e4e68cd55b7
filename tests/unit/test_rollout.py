"""shared/rollout/rollout.py: chunks are env-major and their segments are runs of one episode."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlfleet.shared.algos.base import ActOutput
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.envs.make import make_vector_env
from rlfleet.shared.rollout.rollout import Rollout, episode_segments, evaluate

USERLAND = Path(__file__).resolve().parents[1] / "userland"


def _done(T: int, n: int, steps: dict[int, list[int]]) -> np.ndarray:
    """Done flags (T, n) with env i done at the time steps `steps[i]`."""
    done = np.zeros((T, n), dtype=bool)
    for i, ts in steps.items():
        done[ts, i] = True
    return done


@pytest.mark.parametrize("T,n,steps,expected", [
    (4, 1, {}, [(0, 4)]),
    (4, 2, {0: [1]}, [(0, 2), (2, 2), (4, 4)]),
    (4, 2, {0: [3], 1: [3]}, [(0, 4), (4, 4)]),          # done on the last step: no empty run
    (4, 2, {1: [0]}, [(0, 4), (4, 1), (5, 3)]),
    (4, 1, {0: [0, 1, 3]}, [(0, 1), (1, 1), (2, 2)]),    # back-to-back episode ends
    (1, 3, {0: [0], 2: [0]}, [(0, 1), (1, 1), (2, 1)]),
    (5, 3, {0: [1, 3], 2: [2]}, [(0, 2), (2, 2), (4, 1), (5, 5), (10, 3), (13, 2)]),
])
def test_episode_segments_by_hand(T, n, steps, expected):
    segments = episode_segments(_done(T, n, steps))
    assert segments == expected
    ChunkMeta(chunk_id="c", length=T * n, policy_version=0, segments=segments)  # tiles


class RandomPolicy:
    """Uniform random actions; enough to end CartPole episodes every ~20 steps. With
    `values`, it plays an on-policy algorithm: extras per step and V(obs) = sum(obs)."""

    version = 3
    on_policy = False

    def __init__(self, seed: int, values: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.values = values

    def act(self, obs: np.ndarray, env_step: int) -> ActOutput:
        actions = self.rng.integers(0, 2, size=obs.shape[0])
        extras = {"value": obs.sum(axis=1)} if self.values else {}
        return ActOutput(actions, extras)

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros(obs.shape[0], dtype=np.int64)

    def bootstrap(self, obs: np.ndarray) -> np.ndarray | None:
        return obs.sum(axis=1).astype(np.float32) if self.values else None


def test_a_rollout_chunk_is_env_major_and_its_segments_never_cross_an_episode_end():
    n, T = 3, 40
    envs = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=n), n, seed=5)
    try:
        rollout = Rollout(envs, RandomPolicy(5), chunk_size=n * T - 1)  # rounded up: 40 steps
        chunks = [rollout.collect() for _ in range(3)]
    finally:
        envs.close()
    assert rollout.env_steps == 3 * n * T
    mid_block_ends = 0
    for k, chunk in enumerate(chunks):
        a = chunk.arrays
        assert chunk.length == n * T and chunk.policy_version == 3
        assert a["obs"].shape == a["next_obs"].shape == (n * T, 4)
        done = a["terminated"] | a["truncated"]

        # env-major: env i's steps are rows i*T .. i*T+T-1, in time order, so within a
        # block each row's next observation is the next row's observation until an episode
        # ends (then the next row starts a fresh episode near the origin)
        for i in range(n):
            rows = np.arange(i * T, (i + 1) * T)
            for r in rows[:-1]:
                if done[r]:
                    assert np.abs(a["obs"][r + 1]).max() <= 0.05  # CartPole's reset range
                else:
                    np.testing.assert_array_equal(a["next_obs"][r], a["obs"][r + 1])
            if k + 1 < len(chunks) and not done[rows[-1]]:  # and on into the next chunk
                np.testing.assert_array_equal(a["next_obs"][rows[-1]],
                                              chunks[k + 1].arrays["obs"][i * T])

        # segments tile the rows in order, each inside one env's block, and a done can only
        # be a segment's last row; a segment ends early only at a done
        segments = chunk.segments
        assert [s for s, _ in segments] == np.cumsum([0] + [m for _, m in segments])[:-1].tolist()
        assert sum(m for _, m in segments) == chunk.length
        for start, m in segments:
            end = start + m - 1
            assert start // T == end // T, f"segment {(start, m)} spans two envs"
            assert not done[start:end].any(), f"segment {(start, m)} crosses a done"
            assert done[end] or end % T == T - 1
            mid_block_ends += int(end % T != T - 1)
        assert len(segments) == n + int(done.reshape(n, T)[:, :-1].sum())
        ChunkMeta(chunk_id=f"c{k}", length=chunk.length, policy_version=chunk.policy_version,
                  episode_returns=chunk.episode_returns,
                  episode_lengths=chunk.episode_lengths, segments=segments)

        # an episode that began and ended inside this chunk is one whole segment: its length
        # and its return are among those the chunk reports
        whole = [(s, m) for s, m in segments
                 if done[s + m - 1] and s % T != 0 and done[s - 1]]
        lengths = Counter(chunk.episode_lengths)
        for s, m in whole:
            assert lengths[m] > 0, (s, m, chunk.episode_lengths)
            lengths[m] -= 1
            assert float(a["reward"][s:s + m].sum()) in chunk.episode_returns
        assert len(chunk.episode_lengths) == int(done.sum())
    assert mid_block_ends > 0, "no episode ended inside a chunk: the test saw no boundary"
    for chunk in chunks:  # `cut` marks exactly the last row of every segment
        ends = np.zeros(chunk.length, dtype=bool)
        ends[[s + m - 1 for s, m in chunk.segments]] = True
        np.testing.assert_array_equal(chunk.arrays["cut"], ends)


def _cartpole(n: int, seed: int, **kwargs) -> object:
    return make_vector_env(EnvConfig(id="CartPole-v1", num_envs=n, kwargs=kwargs), n, seed)


def test_episode_chunks_hold_whole_episodes_never_split_or_merged():
    n, per_chunk = 4, 3
    envs = _cartpole(n, seed=11)
    try:
        rollout = Rollout(envs, RandomPolicy(11), mode="episodes", episodes_per_chunk=per_chunk)
        chunks = [rollout.collect() for _ in range(8)]
    finally:
        envs.close()
    seen_starts = set()
    for chunk in chunks:
        a = chunk.arrays
        assert len(chunk.segments) == per_chunk == len(chunk.episode_lengths)
        assert [m for _, m in chunk.segments] == chunk.episode_lengths
        ChunkMeta(chunk_id="c", length=chunk.length, policy_version=chunk.policy_version,
                  episode_returns=chunk.episode_returns,
                  episode_lengths=chunk.episode_lengths, segments=chunk.segments)
        done = a["terminated"] | a["truncated"]
        for (start, m), ret in zip(chunk.segments, chunk.episode_returns, strict=True):
            rows = slice(start, start + m)
            # one episode: starts from a reset, runs step by step, ends at its only done
            assert np.abs(a["obs"][start]).max() <= 0.05
            np.testing.assert_array_equal(a["next_obs"][start:start + m - 1],
                                          a["obs"][start + 1:start + m])
            assert done[start + m - 1] and not done[start:start + m - 1].any()
            assert a["cut"][rows].tolist() == [False] * (m - 1) + [True]
            assert float(a["reward"][rows].sum()) == pytest.approx(ret)
            key = a["obs"][start].tobytes()
            assert key not in seen_starts, "an episode appears twice"
            seen_starts.add(key)
    # every finished episode went into exactly one chunk, in the order they finished
    assert sum(len(c.segments) for c in chunks) == 8 * per_chunk


def test_bootstrap_values_sit_on_cut_rows_that_did_not_terminate():
    """Samples mode: V(next obs) where a run is cut by the chunk's end or a time limit, 0 on
    terminations and inside runs; episodes mode: only at time limits."""
    n = 3
    envs = _cartpole(n, seed=2, max_episode_steps=7)  # time limits inside every chunk
    try:
        policy = RandomPolicy(2, values=True)
        rollout = Rollout(envs, policy, chunk_size=n * 10)
        chunks = [rollout.collect() for _ in range(4)]
    finally:
        envs.close()
    for chunk in chunks:
        a = chunk.arrays
        boot, cut, term = a["bootstrap_value"], a["cut"], a["terminated"]
        alive_cut = cut & ~term
        assert a["truncated"].any() and alive_cut.sum() > n
        np.testing.assert_allclose(boot[alive_cut], a["next_obs"][alive_cut].sum(axis=1),
                                   rtol=1e-6)
        assert (boot[~alive_cut] == 0).all()
        np.testing.assert_allclose(a["value"], a["obs"].sum(axis=1), rtol=1e-6)

    envs = _cartpole(n, seed=3, max_episode_steps=7)
    try:
        rollout = Rollout(envs, RandomPolicy(3, values=True), mode="episodes",
                          episodes_per_chunk=5)
        chunk = rollout.collect()
    finally:
        envs.close()
    a = chunk.arrays
    trunc = a["truncated"] & ~a["terminated"]
    np.testing.assert_allclose(a["bootstrap_value"][trunc], a["next_obs"][trunc].sum(axis=1),
                               rtol=1e-6)
    assert (a["bootstrap_value"][~trunc] == 0).all()


@pytest.mark.parametrize("episodes,num_envs", [(10, 4), (7, 7), (9, 3), (3, 5)])
def test_evaluation_spreads_episodes_evenly_and_means_the_finished_ones(
        monkeypatch, episodes, num_envs):
    """Env i's episodes last 2(i+1) steps. An evaluator that counted whichever episodes
    finish first would be dominated by env 0's short ones; this one runs env i exactly
    episodes // n (+1 for the first episodes % n envs) episodes."""
    monkeypatch.syspath_prepend(str(USERLAND))
    import my_rl

    my_rl.LengthByIndex.made = 0
    envs = make_vector_env(EnvConfig(id="my_rl:LengthByIndex", num_envs=num_envs),
                           num_envs, seed=0)
    try:
        returns, lengths, successes, truncated, _ = evaluate(envs, RandomPolicy(0), episodes,
                                                             seed=1)
    finally:
        envs.close()
    quota = [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]
    expected = Counter({2 * (i + 1): q for i, q in enumerate(quota) if q})
    assert Counter(lengths) == expected
    assert returns == [float(m) for m in lengths]  # reward 1 per step
    assert len(returns) == episodes
    assert successes == [None] * episodes  # the env reports no `is_success`
    assert truncated == [False] * episodes  # every episode terminated
    mean = sum(2 * (i + 1) * q for i, q in enumerate(quota)) / episodes
    assert float(np.mean(returns)) == pytest.approx(mean)


class _Watching:
    """Acts 1 (pays 1 on `endless:Endless`) and keeps every observation it acts on."""

    version = 0

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        self.seen.append(obs.copy())
        return np.ones(obs.shape[0], dtype=np.int64)


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_an_episode_that_never_ends_is_cut_at_the_cap_and_counted_truncated(
        monkeypatch, backend):
    """No terminal state and no time limit: without the cap this evaluation never returns.
    Each cut env starts a fresh episode at once, alone."""
    monkeypatch.syspath_prepend(str(USERLAND))
    monkeypatch.setenv("PYTHONPATH", str(USERLAND))  # async: the envs' own processes
    envs = make_vector_env(EnvConfig(id="endless:Endless", num_envs=3, backend=backend),
                           3, seed=0)
    policy = _Watching()
    try:
        done = evaluate(envs, policy, 7, seed=1, max_steps=5)
    finally:
        envs.close()
    assert done.lengths == [5] * 7 and done.returns == [5.0] * 7
    assert done.truncated == [True] * 7
    steps = np.stack([obs[:, 0] for obs in policy.seen])  # (vector steps, envs)
    assert steps.max() == pytest.approx(0.004)  # never acted past step 4 of an episode
    # env 0 runs three episodes: it starts again from step 0 every 5 steps
    assert np.allclose(steps[:15, 0], np.tile(np.arange(5) / 1000, 3))


def test_the_cap_cuts_only_episodes_still_running_at_it(monkeypatch):
    """Env i's episodes last 2(i+1) steps: with the cap at 4, env 0 (2 steps) and env 1 (4:
    its end at the cap is its own) terminate; env 2 (6) is cut."""
    monkeypatch.syspath_prepend(str(USERLAND))
    import my_rl

    my_rl.LengthByIndex.made = 0
    envs = make_vector_env(EnvConfig(id="my_rl:LengthByIndex", num_envs=3), 3, seed=0)
    try:
        done = evaluate(envs, RandomPolicy(0), 6, seed=1, max_steps=4)
        uncapped = evaluate(envs, RandomPolicy(0), 6, seed=1, max_steps=None)
    finally:
        envs.close()
    by_length = sorted(zip(done.lengths, done.truncated, strict=True))
    assert by_length == [(2, False), (2, False), (4, False), (4, False), (4, True), (4, True)]
    assert sorted(uncapped.lengths) == [2, 2, 4, 4, 6, 6] and not any(uncapped.truncated)
    with pytest.raises(ValueError, match="eval.max_steps=0"):
        evaluate(envs, RandomPolicy(0), 1, seed=1, max_steps=0)


def test_evaluation_reports_info_values_and_the_env_reported_return(monkeypatch):
    """`eval.info_keys` and `eval.episode_return_key`: env i's episodes last 2(i+1) steps and
    its last step's info says `distance` (that length) and `episode.r` (100 per step)."""
    monkeypatch.syspath_prepend(str(USERLAND))
    import my_rl

    my_rl.LengthByIndex.made = 0
    envs = make_vector_env(EnvConfig(id="my_rl:ScoredByIndex", num_envs=3), 3, seed=0)
    try:
        done = evaluate(envs, RandomPolicy(0), 6, seed=1, info_keys=("distance", "missing"),
                        return_key="episode.r")
        plain = evaluate(envs, RandomPolicy(0), 6, seed=1, return_key="no.such")
    finally:
        envs.close()
    assert done.returns == [100.0 * n for n in done.lengths]
    assert done.infos["distance"] == [float(n) for n in done.lengths]
    assert done.infos["missing"] == [None] * 6
    assert plain.returns == [float(n) for n in plain.lengths] and plain.infos == {}


@pytest.mark.parametrize("mode", ["samples", "episodes"])
def test_vector_rewards_are_scalarised_and_each_component_reported(monkeypatch, mode):
    monkeypatch.syspath_prepend(str(USERLAND))
    cfg = EnvConfig(id="my_rl:TwoObjectiveWalk", num_envs=3, reward_weights=(1.0, 2.0))
    envs = make_vector_env(cfg, 3, seed=4)
    try:
        rollout = Rollout(envs, RandomPolicy(4), chunk_size=300, mode=mode,
                          episodes_per_chunk=5)
        chunks = [rollout.collect() for _ in range(3)]
    finally:
        envs.close()
    n_eps = 0
    for chunk in chunks:
        assert len(chunk.episode_return_components) == len(chunk.episode_returns)
        ChunkMeta(chunk_id="c", length=chunk.length, policy_version=0,
                  episode_returns=chunk.episode_returns,
                  episode_lengths=chunk.episode_lengths, segments=chunk.segments,
                  episode_return_components=chunk.episode_return_components)
        for ret, length, (progress, energy) in zip(
                chunk.episode_returns, chunk.episode_lengths,
                chunk.episode_return_components, strict=True):
            assert energy == pytest.approx(-0.01 * length)
            assert ret == pytest.approx(progress + 2.0 * energy)
            n_eps += 1
        # what algorithms see is the scalar: weights . components, per step
        rewards = chunk.arrays["reward"].astype(np.float64)
        near = np.isclose(rewards[:, None], [-0.05 - 0.02, 1.0 - 0.02], atol=1e-6)
        assert near.any(axis=1).all()
    assert n_eps > 3
