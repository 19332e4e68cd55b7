"""`env.backend: envpool`: EnvPool's batches behind the same same-step autoreset contract the
rollout, frame packing and evaluation rely on."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("envpool")

from rlfleet.shared.contract.config import ConfigError, EnvConfig
from rlfleet.shared.contract.frames import pack, unpack  # noqa: E402
from rlfleet.shared.envs.make import env_spec, make_vector_env  # noqa: E402
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import parse_config

from .test_frames import RandomPolicy  # noqa: E402


def _pong(**atari) -> EnvConfig:
    return EnvConfig(id="ALE/Pong-v5", num_envs=3, backend="envpool",
                     atari={"max_episode_frames": 160, **atari})


def test_episode_ends_reset_in_the_same_step_with_the_final_stack_reported():
    envs = make_vector_env(_pong(), 3, seed=0)
    try:
        obs, _ = envs.reset()
        assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
        ends = 0
        for _ in range(100):
            prev = obs
            obs, _, term, trunc, info = envs.step(np.zeros(3, dtype=np.int64))
            done = term | trunc
            for i in np.flatnonzero(done):
                ends += 1
                final = info["final_obs"][i]
                assert (final[:3] == prev[i, 1:]).all()  # the last stack moved on by one
                assert (obs[i, 1:] == obs[i, :1]).all()  # the next episode's fresh stack
            running = np.flatnonzero(~done)
            assert (obs[running, :3] == prev[running, 1:]).all()
        assert ends >= 3  # 40 agent steps per episode
    finally:
        envs.close()


def test_rollouts_on_envpool_pack_and_rebuild_exactly():
    from rlfleet.shared.rollout.rollout import Rollout

    envs = make_vector_env(_pong(), 3, seed=1)
    try:
        rollout = Rollout(envs, RandomPolicy(6), chunk_size=120)
        for _ in range(2):
            chunk = rollout.collect()
            packed = pack(chunk.arrays)
            rebuilt = unpack(packed)
            np.testing.assert_array_equal(rebuilt["obs"], chunk.arrays["obs"])
            np.testing.assert_array_equal(rebuilt["next_obs"], chunk.arrays["next_obs"])
            assert len(packed["frames"]) < 1.2 * len(chunk.arrays["reward"]) + 40
    finally:
        envs.close()


class _Left:
    """Pushes CartPole's cart left: it falls after about 9 steps, never within 3."""

    version = 0

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


def test_an_evaluation_cut_at_its_cap_resets_only_the_cut_envs():
    """CartPole never ends in 3 steps: every episode is cut at `max_steps`, its env alone
    reset by mask, and the evaluation ends."""
    from rlfleet.shared.rollout.rollout import evaluate

    cfg = EnvConfig(id="CartPole-v1", num_envs=3, backend="envpool")
    envs = make_vector_env(cfg, 3, seed=0)
    try:
        done = evaluate(envs, _Left(), 5, seed=0, max_steps=3)
        obs, _ = envs.reset()
        kept = obs.copy()
        again, _ = envs.reset(options={"reset_mask": np.array([False, True, False])})
        np.testing.assert_array_equal(again[[0, 2]], kept[[0, 2]])
    finally:
        envs.close()
    assert done.lengths == [3] * 5 and done.truncated == [True] * 5


def test_mujoco_on_envpool_has_gymnasiums_spec_and_clips_actions():
    cfg = EnvConfig(id="Hopper-v5", num_envs=2, backend="envpool")
    assert env_spec(cfg) == env_spec(EnvConfig(id="Hopper-v5"))
    envs = make_vector_env(cfg, 2, seed=0)
    try:
        envs.reset()
        obs, reward, *_ = envs.step(np.full((2, 3), 5.0))  # clipped to [-1, 1]
        assert obs.shape == (2, 11) and np.isfinite(reward).all()
    finally:
        envs.close()


def test_an_env_envpool_lacks_is_a_config_error_naming_the_backend():
    data = {"env": {"id": "CartPole-v9", "backend": "envpool"}}
    with pytest.raises(ConfigError, match="env.backend='envpool'.*CartPole-v9"):
        check_runnable(parse_config(data), build=False)


def test_without_the_package_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError
    with pytest.raises(ConfigError, match=r"env.backend='envpool'.*pip install"):
        check_runnable(parse_config({"env": {"id": "Hopper-v5", "backend": "envpool"}}),
                         build=False)
