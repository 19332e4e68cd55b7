"""Each frame stored once: packed chunks rebuild exactly what the stacked env returned."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.shared.batching.arena import ChunkArena
from rlfleet.shared.batching.batching import assemble_from
from rlfleet.shared.batching.rows import batch_fields
from rlfleet.shared.contract.frames import FRAMES, INDEX, field_layout, pack, packable, take, unpack
from rlfleet.shared.rollout.rollout import Rollout


class RandomPolicy:
    """Acts uniformly at random: what is under test is the storage, not the acting."""

    version = 0

    def __init__(self, n_actions: int, seed: int = 0) -> None:
        self.n_actions = n_actions
        self.rng = np.random.default_rng(seed)

    def act(self, obs, env_step):
        return SimpleNamespace(actions=self.rng.integers(0, self.n_actions, len(obs)),
                               extras={})

    def bootstrap(self, obs):
        return None


class Flicker(gym.Env):
    """A cheap image env: each step draws a new random 12x12 frame; episodes end at random
    (terminated or truncated), so chunks cross many episode boundaries."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (12, 12), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.t = 0

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (12, 12), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        end = self.np_random.random() < 0.08
        terminated = end and self.np_random.random() < 0.5
        truncated = end and not terminated
        return self._frame(), float(action), terminated, truncated, {}


def _stacked_vec(make, n: int, stack: int, seed: int) -> gym.vector.VectorEnv:
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.FrameStackObservation(make(), stack) for _ in range(n)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=seed)
    return envs


def _pong(max_steps: int = 40):
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)

    def make():
        env = gym.make("ALE/Pong-v5", frameskip=1, max_episode_steps=4 * max_steps)
        return gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84,
                                               grayscale_obs=True, noop_max=30)
    return make


def _chunks(envs, mode: str, count: int, seed: int = 0, **kwargs) -> list:
    rollout = Rollout(envs, RandomPolicy(int(envs.single_action_space.n), seed), mode=mode,
                      **kwargs)
    return [rollout.collect() for _ in range(count)]


def _assert_rebuilds(arrays: dict) -> dict:
    packed = pack(arrays)
    assert "obs" not in packed and "next_obs" not in packed
    rebuilt = unpack(packed)
    for name in ("obs", "next_obs"):
        assert rebuilt[name].dtype == np.uint8
        np.testing.assert_array_equal(rebuilt[name], arrays[name])
    for key in arrays:  # every other column passes through untouched
        if key not in INDEX:
            np.testing.assert_array_equal(rebuilt[key], arrays[key])
    return packed


def test_pong_stacks_rebuild_exactly_across_episode_boundaries():
    """Real ALE frames with gymnasium's preprocessing and 4-frame stack; time limits of 40
    agent steps put several episode ends (and stacks padded with reset frames) in each
    chunk."""
    envs = _stacked_vec(_pong(), n=3, stack=4, seed=3)
    chunks = _chunks(envs, "samples", 3, chunk_size=150)
    assert sum(len(c.episode_returns) for c in chunks) >= 6
    for chunk in chunks:
        arrays = chunk.arrays
        assert arrays["obs"].shape[1:] == (4, 84, 84)
        packed = _assert_rebuilds(arrays)
        rows = len(arrays["reward"])
        episodes = len(chunk.episode_returns)
        # one new frame per step, plus a fresh stack per run and per episode start
        assert len(packed[FRAMES]) <= rows + 4 * (envs.num_envs + episodes)
        assert packed[FRAMES].nbytes < arrays["obs"].nbytes / 3.5


def test_padded_reset_stacks_repeat_one_stored_frame():
    envs = _stacked_vec(_pong(max_steps=10), n=1, stack=4, seed=0)
    [chunk] = _chunks(envs, "samples", 1, chunk_size=25)
    arrays = chunk.arrays
    packed = pack(arrays)
    # gymnasium pads a fresh stack with its reset frame: the first row's stack is one frame
    assert (packed["obs_frames"][0] == packed["obs_frames"][0][0]).all()
    first_of_episode = np.flatnonzero(arrays["terminated"] | arrays["truncated"])[0] + 1
    assert len(set(packed["obs_frames"][first_of_episode].tolist())) == 1


@pytest.mark.parametrize("mode", ["samples", "episodes"])
def test_many_episode_ends_both_cutting_modes(mode):
    envs = _stacked_vec(Flicker, n=4, stack=3, seed=11)
    chunks = _chunks(envs, mode, 5, chunk_size=64, episodes_per_chunk=3)
    assert sum(len(c.episode_returns) for c in chunks) >= 10
    for chunk in chunks:
        _assert_rebuilds(chunk.arrays)


def test_images_that_are_not_stacks_stay_exact():
    """Channels that do not shift from step to step share nothing, and still rebuild."""
    rng = np.random.default_rng(0)
    n = 30
    arrays = {"obs": rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8),
              "next_obs": rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8),
              "reward": np.zeros(n, np.float32), "cut": np.zeros(n, bool)}
    arrays["cut"][-1] = True
    packed = _assert_rebuilds(arrays)
    assert len(packed[FRAMES]) == 6 * n


def test_only_stacked_uint8_images_are_packed():
    n = 4
    base = {"reward": np.zeros(n, np.float32), "cut": np.ones(n, bool)}
    assert packable({**base, "obs": np.zeros((n, 4, 5, 5), np.uint8),
                     "next_obs": np.zeros((n, 4, 5, 5), np.uint8)})
    assert not packable({**base, "obs": np.zeros((n, 4), np.float32),
                         "next_obs": np.zeros((n, 4), np.float32)})
    assert not packable({**base, "obs": np.zeros((n, 4, 5, 5), np.float32),
                         "next_obs": np.zeros((n, 4, 5, 5), np.float32)})
    assert not packable({**base, "obs": np.zeros((n, 5, 5), np.uint8),
                         "next_obs": np.zeros((n, 5, 5), np.uint8)})


def test_the_learner_arena_rebuilds_sampled_stacks():
    """Chunks of different frame counts in one arena (it grows, rebasing indices), then
    batches through the same gather the learner uses: equal to the rollout's own arrays."""
    envs = _stacked_vec(Flicker, n=2, stack=4, seed=5)
    chunks = _chunks(envs, "episodes", 6, episodes_per_chunk=2)
    originals = {str(i): c.arrays for i, c in enumerate(chunks)}
    packed = {cid: pack(a) for cid, a in originals.items()}
    arena = ChunkArena(lambda ids: [packed[i] for i in ids], capacity=2)
    rng = np.random.default_rng(1)
    for ids in (["0"], ["1", "2"], ["3", "0"], ["4", "5", "1"], ["2"]):
        offsets = arena.offsets(ids)
        columns = arena.columns
        for k, cid in enumerate(ids):
            n = len(originals[cid]["reward"])
            rows = offsets[k] + rng.integers(0, n, size=(2, 7))
            local = rows - offsets[k]
            for name in ("obs", "next_obs"):
                np.testing.assert_array_equal(take(columns, name, rows),
                                              originals[cid][name][local])
        assert field_layout(columns, "obs") == (np.dtype(np.uint8), (4, 12, 12))
        part = SimpleNamespace(chunk_index=[[0, 0, 0]], rows=[[0, 1, 2]],
                               sequence_length=None, weights=None, item_ids=[[0, 1, 2]],
                               buffer="replay", key="replay")
        [batch] = assemble_from(columns, offsets, [part], 1, batch_fields(columns))
        np.testing.assert_array_equal(batch.data["obs"].numpy(), originals[ids[0]]["obs"][:3])
        assert batch.data["obs"].dtype.is_floating_point is False  # uint8 to the learner


def test_one_process_keeps_frames_once_and_learns_from_them():
    """`rlfleet single` on Pong stores packed chunks and trains the Nature DQN on stacks
    rebuilt from them. Small batches and a tight rate limit (the default error buffer lets
    the learner run 64k samples ahead): a Nature CNN update of 32 stacks is slow on one CPU
    thread, and the point here is the data path, not the network."""
    pytest.importorskip("ale_py")
    from rlfleet.shared.run.config import parse_config
    from rlfleet.single_process import run_single

    cfg = parse_config({
        "env": {"id": "ALE/Pong-v5", "num_envs": 4, "atari": {"max_episode_frames": 800}},
        "algo": {"name": "dqn", "batch_size": 8},
        "collector": {"chunk_size": 256},
        "buffers": {"replay": {"rate_limit": {"min_size": 512, "samples_per_insert": 2,
                                                "error_buffer": 64}}},
        "learner": {"chunk_cache": 32},
        "eval": {"every_env_steps": 10**9, "stop_value": None},
        "stop": {"max_env_steps": 3000}})
    result = run_single(cfg)
    assert result.env_steps >= 3000
    # the limiter holds: two samples per inserted step, at most 64 ahead
    assert 100 < result.train_iterations <= (result.env_steps * 2 + 64) // 8
