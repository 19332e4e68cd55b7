"""A collector's random warm-up while torch loads (collector/acting.py): allowed only where the
algorithm would itself act uniformly at random (the built-in DQN from epsilon 1, until its
buffer's `min_size`), never for PPO or a user's policy; its chunks say policy version -1 and
hold valid actions; and none of it needs torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlfleet.collector.acting import RandomPolicy, random_warmup_steps
from rlfleet.shared.envs.make import env_spec, make_vector_env
from rlfleet.shared.rollout.rollout import Rollout
from rlfleet.shared.run.config import load_config

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
    ("cartpole-dqn.yaml", {"policy": "rlfleet.shared.algos.dqn:DQN"}),  # a policy by import path
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
            "import rlfleet.collector.service\n"
            "from rlfleet.collector.acting import RandomPolicy, random_warmup_steps\n"
            "from rlfleet.shared.rollout.rollout import Rollout\n"
            "from rlfleet.shared.run.config import load_config\n"
            "from rlfleet.shared.envs.make import env_spec, make_vector_env\n"
            "cfg = load_config('configs/cartpole-dqn.yaml')\n"
            "envs = make_vector_env(cfg.env, 2, 0)\n"
            "Rollout(envs, RandomPolicy(env_spec(cfg.env), 0), 16).collect(0)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_collector_joining_mid_run_explores_from_the_runs_steps_not_at_random(
        coordinator, task_sink, tmp_path: Path):
    """The random warm-up belongs to the run's start: a collector (re)started after it is
    told the run's env steps when it registers, and acts with the real policy from there."""
    from rlfleet.collector.adder import StorageAdder
    from rlfleet.collector.service import CollectorService
    from rlfleet.shared.contract.wire.tasks import CollectTask, TaskEnvelope
    from rlfleet.shared.infra.http import HttpClient
    from rlfleet.shared.infra.storage.directory import DirectoryStorage

    from .helpers import register, wait_for, wait_running

    c = coordinator()
    first = task_sink()
    worker_id = register(c, "collector", first)["worker_id"]
    task_id = first.wait_task("collect")["task_id"]
    wait_running(c, task_id)
    store = DirectoryStorage(c.storage_dir)
    client = HttpClient(c.url, timeout_s=5, retries=2)
    adder = StorageAdder(store, client, lambda: worker_id, lambda: task_id,
                         report_interval_s=0.02)
    rng = np.random.default_rng(0)
    for _ in range(3):  # 384 env steps: past the test config's min_size of 256
        n = 128
        adder.add({"obs": rng.standard_normal((n, 4)).astype(np.float32),
                   "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
                   "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
                   "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)},
                  -1, [], [])
    assert adder.flush(timeout=10)
    adder.close(timeout=5)
    client.close()

    sink = task_sink()
    service = CollectorService(c.url, sink.url)
    try:
        service.agent._register(retries=0)
        assert service.agent.info.env_steps == 384
        task = CollectTask.model_validate(sink.wait_task("collect"))
        service.accept(TaskEnvelope(task=task))
        wait_for(lambda: service.counters.chunks_reported >= 2, timeout_s=60,
                 what="the new collector's chunks")
        assert service.counters.random_steps == 0, "acted at random after the run's warm-up"
        assert service.adder is not None and service.adder.global_env_steps >= 384
    finally:
        service.close()
        sink.close()
