"""collector/rollout.py: chunks are env-major and their segments are runs of one episode."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from collector.rollout import Rollout, episode_segments
from shared.config import EnvConfig
from shared.envs import make_vector_env
from shared.schemas import ChunkMeta


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
    """Uniform random actions; enough to end CartPole episodes every ~20 steps."""

    version = 3

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        return self.rng.integers(0, 2, size=obs.shape[0])

    def act_eval(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(obs.shape[0], dtype=np.int64)

    def load(self, version, state) -> None:
        raise AssertionError("not used")


def test_a_rollout_chunk_is_env_major_and_its_segments_never_cross_an_episode_end():
    n, T = 3, 40
    envs = make_vector_env(EnvConfig(id="CartPole-v1", num_envs=n), n, seed=5)
    try:
        rollout = Rollout(envs, RandomPolicy(5), chunk_size=n * T - 1)  # rounded up: 40 steps
        chunks = [rollout.collect(epsilon=1.0) for _ in range(3)]
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
