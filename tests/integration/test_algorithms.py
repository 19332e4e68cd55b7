"""More than one algorithm, end to end through `rlfleet up`: PPO through the queue buffer,
and a user's own policy and environment named by import path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlfleet.shared.contract.codec import decode_weights

from .helpers import REPO, config_from

USERLAND = REPO / "tests" / "userland"


def _evaluations(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "evaluations.json").read_text())


def test_ppo_solves_cartpole_on_a_cluster_and_keeps_the_policy_that_did(launch, tmp_path):
    config = config_from(tmp_path, "cartpole-ppo.yaml", stop={"max_wall_s": 240})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=300)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["algo"] == "ppo"
    assert summary["eval_return"] >= 475
    # the learner measured policy lag on what it trained on, within the configured bound
    train = summary["train"]
    assert 0 <= train["policy_lag_mean"] <= train["policy_lag_max"] <= 3
    assert {"policy_loss", "value_loss", "entropy", "approx_kl"} <= set(train)
    # every evaluation ran deterministic and stochastic episodes on one schedule
    evals = _evaluations(run_dir)
    assert evals and all(e["deterministic"]["episodes"] == 10 for e in evals)
    assert all(e["stochastic"]["episodes"] == 10 for e in evals)
    # the policy that reached the stop value is kept: the best policy of the run
    best = max(evals, key=lambda e: e["return_mean"])
    assert summary["best_policy_version"] == best["policy_version"]
    state, meta = decode_weights(Path(summary["best_policy"]).read_bytes())
    assert int(meta["policy_version"]) == best["policy_version"]
    assert state and all(np.isfinite(t.numpy()).all() for t in state.values())
    up.assert_no_orphans()


def test_a_users_own_policy_and_env_by_import_path_train_end_to_end(launch, tmp_path):
    """`my_rl` lives outside the project, importable through PYTHONPATH like a user's
    package: a line-walking env and a dueling-DQN policy class. Collectors cut chunks by
    whole episodes here."""
    config = config_from(
        tmp_path, "cartpole-dqn.yaml",
        env={"id": "my_rl:LineWalk", "num_envs": 4},
        collector={"mode": "episodes", "episodes_per_chunk": 4},
        algo={"policy": "my_rl:DuelingDQN", "params": {"tag": "dueling"},
              "hidden_sizes": [32, 32], "eps_decay_steps": 2000},
        buffers={"replay": {"kind": "uniform", "capacity": 20000,
                            "rate_limit": {"min_size": 500, "samples_per_insert": 16,
                                           "error_buffer": 8000}}},
        eval={"every_env_steps": 1000, "episodes": 8, "num_envs": 4, "stop_value": 0.75,
              "video": {"every_evaluations": 1}},  # LineWalk cannot render: one warning
        stop={"max_wall_s": 150})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=200)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["env"] == "my_rl:LineWalk"
    assert summary["eval_return"] >= 0.75
    # every chunk held 4 whole episodes
    assert summary["chunks_accepted"] > 0
    assert summary["episodes"] == 4 * summary["chunks_accepted"]
    # the published weights are the user's dueling network, not the built-in Q-network
    state, _ = decode_weights(Path(summary["best_policy"]).read_bytes())
    assert {"value.weight", "advantage.weight"} <= set(state)
    # asked for videos of an env that cannot render: one warning, no video, the run went on
    log = (run_dir / "logs" / "collector-1.log").read_text()
    assert log.count("no evaluation videos from this collector") == 1, log[-3000:]
    assert summary["videos"] == [] and not (run_dir / "videos").exists()
    up.assert_no_orphans()


@pytest.mark.parametrize("changes,message", [
    ({"env": {"id": "my_rl:NoSuchEnv"}},
     "env.id='my_rl:NoSuchEnv': module 'my_rl' has no attribute 'NoSuchEnv'"),
    ({"algo": {"policy": "no_such_package.policies:Mine"}},
     "algo.policy='no_such_package.policies:Mine': cannot import module "
     "'no_such_package.policies'"),
    ({"algo": {"policy": "my_rl:NOT_A_POLICY"}},
     "algo.policy='my_rl:NOT_A_POLICY' is not a Policy class"),
    ({"algo": {"policy": "my_rl.DuelingDQN"}},
     "algo.policy='my_rl.DuelingDQN': expected 'package.module:attr'"),
    ({"env": {"id": "Pendulum-v1"}}, "algo.name='dqn' needs a discrete action space"),
])
def test_a_wrong_import_path_is_a_config_error_saying_what_was_looked_up(
        launch, tmp_path, changes, message):
    config = config_from(tmp_path, "cartpole-dqn.yaml", **changes)
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--run-dir", str(run_dir), "--quiet",
                env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=60)
    assert code == 2, f"exit code {code}:\n{up.stderr}"
    assert message in up.stderr.replace("\n", " ")
    assert "Traceback" not in up.stderr
    assert not (run_dir / "logs").exists(), "no cluster was started"
