"""The bit-flipping env and goal envs' plumbing: registered by id with `n_bits`, its goal dict
flattened in a fixed order, batched `compute_reward`, and success counted by evaluation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.envs.bitflip import BitFlipEnv
from rlfleet.shared.envs.goals import FlattenGoalObs
from rlfleet.shared.envs.make import env_spec, goal_functions, make_vector_env
from rlfleet.shared.rollout.rollout import evaluate

N = 7
CFG = EnvConfig(id="rlfleet/BitFlip-v0", kwargs={"n_bits": N})


class Perfect:
    """Flips the first bit where state and goal differ."""

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return (obs[:, N:2 * N] != obs[:, 2 * N:]).argmax(axis=1)


class Stubborn:
    """Flips bit 0 forever: reaches the goal only when that is all that differs."""

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


def test_an_episode_by_hand():
    env = BitFlipEnv(n_bits=3)
    obs, info = env.reset(seed=0)
    assert set(obs) == {"observation", "achieved_goal", "desired_goal"}
    assert not np.array_equal(obs["achieved_goal"], obs["desired_goal"])  # never solved at 0
    assert np.array_equal(obs["observation"], obs["achieved_goal"]) and not info["is_success"]
    differ = np.flatnonzero(obs["achieved_goal"] != obs["desired_goal"])
    for k, bit in enumerate(differ):
        obs, reward, terminated, truncated, info = env.step(int(bit))
        last = k == len(differ) - 1
        assert (reward, terminated, truncated, info["is_success"]) == (
            (0.0, True, False, True) if last else (-1.0, False, False, False))
    env.reset(seed=1)
    env.state[:], env.goal[:] = 0, 1  # three flips away; flipping bit 0 back and forth
    steps = [env.step(0)[1:4] for _ in range(3)]
    assert steps == [(-1.0, False, False)] * 2 + [(-1.0, False, True)]  # n steps: truncated


def test_compute_reward_and_terminated_take_batches():
    achieved = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 0]], dtype=np.float32)
    desired = np.array([[0, 1, 1], [1, 0, 1], [0, 0, 0]], dtype=np.float32)
    assert BitFlipEnv.compute_reward(achieved, desired, {}).tolist() == [0.0, -1.0, 0.0]
    assert BitFlipEnv.compute_terminated(achieved, desired, {}).tolist() == [True, False, True]
    reward, terminated = goal_functions(CFG)
    assert reward(achieved, desired, {}).tolist() == [0.0, -1.0, 0.0]
    assert terminated is not None


def test_made_by_id_and_flattened_in_a_fixed_order():
    env = gym.make("rlfleet/BitFlip-v0", n_bits=N)
    flat = FlattenGoalObs(env)
    obs, _ = flat.reset(seed=3)
    raw = env.unwrapped._obs()
    assert obs.dtype == np.float32 and obs.shape == (3 * N,)
    assert np.array_equal(obs, np.concatenate([raw["observation"], raw["achieved_goal"],
                                               raw["desired_goal"]]))
    spec = env_spec(CFG)
    assert spec.obs_shape == (3 * N,) and spec.n_actions == N and spec.goal is not None
    assert env_spec(EnvConfig()).goal is None  # CartPole: not a goal env


@pytest.mark.parametrize("policy, low, high", [(Perfect(), 1.0, 1.0), (Stubborn(), 0.0, 0.5)])
def test_evaluation_counts_success_from_the_envs_info(policy, low, high):
    envs = make_vector_env(CFG, 5, seed=0)
    returns, _, successes, *_ = evaluate(envs, policy, 40, seed=0)
    envs.close()
    assert len(returns) == len(successes) == 40
    assert low <= np.mean(successes) <= high
    # bit flipping's return says it as well: above -n_bits exactly when the goal was met
    assert successes == [r > -N for r in returns]
