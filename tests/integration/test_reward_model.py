"""A cluster run with Random Network Distillation on MountainCar (`rlfleet up`): the learner
trains on the reward model's rewards and logs its metrics, its checkpoints hold the model's
state, a run killed with SIGKILL and resumed continues the same model, and it reaches the goal
(an evaluation above -200) within 30,000 env steps (`bench/rnd.py` compares it with plain DQN
over seeds; bench/RESULTS.md has the figures)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlfleet.shared.contract.codec import decode_weights

from .helpers import REPO, checkpoint_index, marked_env, metric_records, wait_for

pytestmark = pytest.mark.slow

BATCH = 64  # configs/mountaincar-rnd.yaml's algo.batch_size: RND counts every row it trains on
METRICS = ("train/reward_model/predictor_loss", "train/reward_model/intrinsic_mean",
           "train/reward_model/intrinsic_std", "train/reward_model/reward_mean")


def _checkpoint(run_dir: Path, entry: dict) -> dict:
    state, _ = decode_weights((run_dir / "storage" / "blobs" / entry["name"]).read_bytes())
    return state


def _assert_model_state(state: dict, train_iterations: int) -> None:
    """The checkpoint holds the reward model, and a model that has trained on every batch
    of the run: one lost on the way (a resume that started it afresh) would have counted
    only the rows since."""
    assert any(k.startswith("reward_model.predictor.") for k in state)
    assert any(k.startswith("reward_model.target.") for k in state)
    assert any(k.startswith("q.") for k in state)  # beside the policy's own
    assert float(state["reward_model.obs_moments.count"]) == BATCH * train_iterations
    assert int(state["train_iterations"]) == train_iterations


def test_rnd_on_mountaincar_logs_checkpoints_and_resumes_its_reward_model(launch, tmp_path):
    data = yaml.safe_load((REPO / "configs" / "mountaincar-rnd.yaml").read_text())
    data["checkpoint"] = {"every_train_iterations": 200, "keep_last": 2}
    data["coordinator"] = {"snapshot_interval_s": 1.0}
    data["logging"] = {"scopes": {"train": {"every_env_steps": 500},
                                  "collect": {"every_env_steps": 1000},
                                  "update": {"every_env_steps": 1000},
                                  "info": {"every_env_steps": 2000}, "eval": {}}}
    # the run ends once an evaluation is above -200: with 10 episodes a mean of at least
    # -199.9 means one of them was shorter than 200 steps, at the flag
    data["eval"].update(every_env_steps=2500, stop_value=-199.9)
    data["stop"] = {"max_env_steps": 30_000, "max_wall_s": 400}
    config = tmp_path / "mountaincar-rnd.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet")

    def trained_a_while() -> bool:
        if up.proc.poll() is not None:
            raise AssertionError(f"rlfleet up exited with {up.proc.returncode}: "
                                 f"{up.proc.stderr.read()[-3000:]}")
        train = [r for r in metric_records(run_dir) if r["scope"] == "train"
                 and METRICS[0] in r]
        return len(train) >= 2 and len(checkpoint_index(run_dir)) >= 2 and \
            (run_dir / "storage" / "blobs" / "snapshot.coordinator").exists()

    wait_for(trained_a_while, 180, "train records with reward model metrics and 2 checkpoints")
    for pid in [up.proc.pid, *up.descendants()]:  # nothing gets to save on the way out
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    up.proc.wait(timeout=30)
    wait_for(lambda: not up.descendants(), 15, "every killed process to be gone")

    # the metrics, logged with the train record
    before = [r for r in metric_records(run_dir) if r["scope"] == "train" and METRICS[0] in r]
    for record in before:
        for key in METRICS:
            assert key in record, (key, sorted(record))
        assert record["train/reward_model/intrinsic_mean"] > 0
    last = checkpoint_index(run_dir)[-1]
    _assert_model_state(_checkpoint(run_dir, last), last["train_iterations"])

    resumed = subprocess.run(
        [sys.executable, "-m", "rlfleet", "resume", str(run_dir), "--collectors", "1",
         "--quiet"], cwd=REPO,
        capture_output=True, text=True, timeout=300, env=marked_env(up.marker))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert resumed.returncode == 0, (summary.get("outcome"), summary.get("best_eval_return"),
                                     summary.get("env_steps"), resumed.stderr[-3000:])
    assert summary["solved"] and summary["eval_return"] > -200
    assert summary["env_steps"] <= 30_000 + 512  # the budget, give or take the last chunks
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert f"resumed from checkpoint at train iteration {last['train_iterations']}" \
        in learner_log
    final = checkpoint_index(run_dir)[-1]
    assert final["train_iterations"] > last["train_iterations"]
    _assert_model_state(_checkpoint(run_dir, final), final["train_iterations"])
    after = [r for r in metric_records(run_dir) if r["scope"] == "train" and METRICS[0] in r
             and r["step"] > before[-1]["step"]]
    assert after, "no train records with the reward model's metrics after the resume"
