"""A collector's random warm-up while torch loads (collector/service.py): allowed only where the
algorithm would itself act uniformly at random (the built-in DQN from epsilon 1, until its
buffer's `min_size`), never for PPO or a user's policy; its chunks say policy version -1 and
hold valid actions; and none of it needs torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collector.rollout import Rollout
from collector.service import RandomPolicy, random_warmup_steps
from shared.config import load_config
from shared.envs import env_spec, make_vector_env

REPO = Path(__file__).resolve().parents[2]


def config(name: str, **algo):
    cfg = load_config(REPO / "configs" / name)
    return cfg.with_overrides(algo={**cfg.algo.model_dump(), **algo}) if algo else cfg


def test_dqn_from_epsilon_1_may_act_at_random_until_its_buffer_can_be_sampled():
    cfg = config("cartpole-dqn.yaml")
    assert cfg.algo.eps_start == 1.0
    assert random_warmup_steps(cfg) == min(b.rate_limit.min_size for b in cfg.buffers.values())


@pytest.mark.parametrize("name, algo", [
    ("cartpole-ppo.yaml", {}),                                 # chunks need log-probs
    ("cartpole-dqn.yaml", {"eps_start": 0.5}),                 # greedy half the time
    ("cartpole-dqn.yaml", {"policy": "shared.algos.dqn:DQN"}),  # a policy by import path
])
def test_anything_else_waits_for_torch(name, algo):
    assert random_warmup_steps(config(name, **algo)) == 0


def test_warmup_chunks_hold_valid_actions_and_say_no_published_policy_acted():
    cfg = config("cartpole-dqn.yaml")
    spec = env_spec(cfg.env)
    envs = make_vector_env(cfg.env, 4, seed=3)
    try:
        rollout = Rollout(envs, RandomPolicy(spec, seed=3), chunk_size=128)
        chunk = rollout.collect(0)
    finally:
        envs.close()
    assert chunk.policy_version == -1
    actions = chunk.arrays["action"]
    assert len(actions) == 128 and set(np.unique(actions)) == {0, 1}
    assert not rollout.bootstraps and "log_prob" not in chunk.arrays


def test_acting_at_random_needs_no_torch():
    code = ("import sys\n"
            "from collector.service import RandomPolicy, random_warmup_steps\n"
            "from collector.rollout import Rollout\n"
            "from shared.config import load_config\n"
            "from shared.envs import env_spec, make_vector_env\n"
            "cfg = load_config('configs/cartpole-dqn.yaml')\n"
            "envs = make_vector_env(cfg.env, 2, 0)\n"
            "Rollout(envs, RandomPolicy(env_spec(cfg.env), 0), 16).collect(0)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
