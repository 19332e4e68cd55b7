"""Observation normalisation: merged moments equal one pass; collectors count, the learner
merges and publishes, and every holder of a version normalises alike."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.config import ConfigError, EnvConfig
from rlfleet.shared.envs.make import env_spec
from rlfleet.shared.rollout.rollout import Rollout, evaluate
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.util.moments import RunningMoments


def test_merged_moments_equal_one_pass_over_all_the_data():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, [1.0, 50.0, 1e-3], size=(10_000, 3)) + rng.standard_cauchy((1, 3))
    total = RunningMoments.empty((3,))
    # uneven pieces, merged in a scrambled order, some of them empty
    cuts = np.sort(rng.choice(np.arange(1, len(data)), size=40, replace=False))
    pieces = np.split(data, cuts) + [data[:0]]
    for i in rng.permutation(len(pieces)):
        total.merge(RunningMoments.of(pieces[i]) if len(pieces[i]) else
                    RunningMoments.empty((3,)))
    assert total.count == len(data)
    np.testing.assert_allclose(total.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(total.var, data.var(axis=0), rtol=1e-9)
    wire = json.loads(json.dumps(total.to_wire()))
    again = RunningMoments.from_wire(wire, (3,))
    np.testing.assert_array_equal(again.mean, total.mean)


@pytest.mark.parametrize("wire", [{"count": 1, "mean": [0, 0], "m2": [0, 0, 0]},
                                  {"count": -1, "mean": [0, 0, 0], "m2": [0, 0, 0]},
                                  {"count": 2, "mean": [0, float("nan"), 0], "m2": [0, 0, 0]},
                                  {"count": 2, "mean": [0, 0, 0], "m2": [0, -1, 0]},
                                  {"mean": [0, 0, 0], "m2": [0, 0, 0]}])
def test_malformed_moments_are_refused(wire):
    ppo = PPO(PPOConfig(obs_norm=True), env_spec(EnvConfig(id="Pendulum-v1")), seed=0)
    with pytest.raises((KeyError, ValueError)):
        ppo.merge_obs_stats(wire)


def test_collectors_count_the_learner_publishes_and_actors_normalise_alike():
    spec = env_spec(EnvConfig(id="Pendulum-v1"))
    learner = PPO(PPOConfig(obs_norm=True), spec, seed=0)
    actors = [PPO(PPOConfig(obs_norm=True), spec, seed=s) for s in (1, 2)]
    envs = [gym.make_vec("Pendulum-v1", num_envs=4, vectorization_mode="sync",
                         vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
            for _ in actors]
    seen = []
    for actor, env in zip(actors, envs, strict=True):
        env.reset(seed=len(seen))
        rollout = Rollout(env, actor, chunk_size=64)
        raw_first = rollout.obs.copy()
        chunk = rollout.collect()
        # version -1 holds no statistics yet: it acts on (and stores) raw observations
        np.testing.assert_allclose(chunk.arrays["obs"][0], raw_first[0], rtol=1e-6)
        assert chunk.obs_moments.count == 64
        seen.append(chunk)
        learner.merge_obs_stats(chunk.obs_moments.to_wire())
    stats = learner.net.obs_norm.moments()
    assert stats.count == 128
    state = learner.policy_state()
    assert {"obs_norm.count", "obs_norm.mean", "obs_norm.var"} <= set(state)
    for actor in actors:
        actor.load_policy(1, state)
    obs = np.array([[1.0, 0.0, 2.0]], dtype=np.float32)
    a, b = (actor.preprocess(obs) for actor in actors)
    np.testing.assert_array_equal(a, b)
    expected = (obs - stats.mean) / np.sqrt(stats.var + 1e-8)
    np.testing.assert_allclose(a, np.clip(expected, -10, 10), rtol=1e-5)
    # the next chunk stores normalised observations; evaluation normalises the same way
    rollout = Rollout(envs[0], actors[0], chunk_size=64)
    raw = rollout.obs.copy()
    chunk = rollout.collect()
    np.testing.assert_allclose(chunk.arrays["obs"][0], actors[0].preprocess(raw)[0], rtol=1e-6)
    frozen = actors[0].net.obs_norm.moments()
    evaluate(envs[1], actors[0], episodes=2, seed=0)
    assert actors[0].net.obs_norm.moments().count == frozen.count  # evaluation only reads
    checkpoint = learner.state_dict()
    fresh = PPO(PPOConfig(obs_norm=True), spec, seed=5)
    fresh.load_state_dict(checkpoint)
    assert torch.equal(fresh.net.obs_norm.mean, learner.net.obs_norm.mean)


def test_obs_norm_is_refused_for_a_learner_group():
    data = {"env": {"id": "Pendulum-v1"}, "algo": {"name": "ppo", "obs_norm": True},
            "buffers": {"rollouts": {"kind": "queue"}},
            "learner": {"count": 2, "mix": [{"buffer": "rollouts", "fraction": 1.0}]}}
    with pytest.raises(ConfigError, match="obs_norm"):
        parse_config(data)


def test_one_process_merges_the_counts_and_solves_invertedpendulum():
    """`rlfleet single` merges each chunk's counts as the learner service does."""
    pytest.importorskip("mujoco")
    from rlfleet.shared.run.config import load_config
    from rlfleet.single_process import run_single

    from .helpers import REPO

    cfg = load_config(REPO / "configs" / "invertedpendulum-ppo.yaml")
    result = run_single(cfg)
    assert result.solved and result.eval_return >= 1000, result
