"""Atari through ale-py with gymnasium's standard preprocessing, in both vector backends."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ale_py")

from rlfleet.shared.contract.config import ConfigError, EnvConfig
from rlfleet.shared.envs.make import env_spec, make_atari, make_vector_env  # noqa: E402
from rlfleet.shared.run.config import parse_config


def _cfg(**atari) -> EnvConfig:
    return EnvConfig(id="ALE/Pong-v5", num_envs=2, atari=atari)


def test_pong_is_four_stacked_uint8_frames_of_84x84():
    spec = env_spec(_cfg())
    assert spec.obs_shape == (4, 84, 84) and spec.n_actions == 6
    envs = make_vector_env(_cfg(), 2, seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84)
        # a fresh stack is its first frame repeated (gymnasium's "reset" padding)
        assert (obs[:, 1:] == obs[:, :1]).all()
    finally:
        envs.close()


def test_the_protocol_settings_reach_the_emulator():
    env = make_atari("ALE/Pong-v5", _cfg(repeat_action_probability=0.1, frame_skip=3,
                                         noop_max=7, screen_size=64, frame_stack=2).atari)
    try:
        pre = env.env  # FrameStackObservation over AtariPreprocessing
        assert pre.frame_skip == 3 and pre.noop_max == 7 and pre.screen_size == (64, 64)
        ale = env.unwrapped.ale
        assert ale.getFloat("repeat_action_probability") == pytest.approx(0.1)
        assert env.unwrapped._frameskip == 1  # skipping is the wrapper's, with max-pooling
        assert env.observation_space.shape == (2, 64, 64)
    finally:
        env.close()


def test_frame_skip_counts_frames_and_may_not_contradict():
    assert _cfg().frame_skip == 4 and _cfg(frame_skip=2).frame_skip == 2
    data = {"env": {"id": "ALE/Pong-v5", "frame_skip": 3, "atari": {"frame_skip": 4}}}
    with pytest.raises(ConfigError, match="frame_skip"):
        parse_config(data)


@pytest.mark.parametrize("field, value", [("frame_stack", 0), ("repeat_action_probability", 2),
                                          ("screen_size", 4), ("sticky", 0.25)])
def test_a_bad_atari_setting_is_refused_by_name(field, value):
    data = {"env": {"id": "ALE/Pong-v5", "atari": {field: value}}}
    with pytest.raises(ConfigError, match=f"env.atari.{field}"):
        parse_config(data)


def test_episode_ends_report_the_final_stack():
    cfg = EnvConfig(id="ALE/Pong-v5", num_envs=2, atari={"max_episode_frames": 200})
    envs = make_vector_env(cfg, 2, seed=1)
    try:
        envs.reset(seed=1)
        for _ in range(60):
            obs, _, term, trunc, info = envs.step(envs.action_space.sample())
            done = term | trunc
            if done.any():
                final = info["final_obs"]
                i = int(np.flatnonzero(done)[0])
                assert final[i].shape == (4, 84, 84) and final[i].dtype == np.uint8
                assert (obs[i, 1:] == obs[i, :1]).all()  # the next episode's fresh stack
                return
        pytest.fail("no episode ended within 50 frames' time limit")
    finally:
        envs.close()


def test_async_steps_the_same_games_as_sync():
    """`env.backend: async` moves the envs into subprocesses and changes nothing else."""
    runs = {}
    for backend in ("sync", "async"):
        cfg = EnvConfig(id="ALE/Pong-v5", num_envs=2, backend=backend, atari={})
        envs = make_vector_env(cfg, 2, seed=5)
        try:
            rng = np.random.default_rng(0)
            frames = [envs.reset(seed=5)[0]]
            for _ in range(30):
                frames.append(envs.step(rng.integers(0, 6, 2))[0])
            runs[backend] = np.stack(frames)
        finally:
            envs.close()
    np.testing.assert_array_equal(runs["sync"], runs["async"])
