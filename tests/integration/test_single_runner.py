"""`rlfleet single` is the cluster's own parts in one process: a run whose coordinator has a
commander (configs/corridor-curriculum.yaml's curriculum) and whose learner has hooks trains
and solves there as it does under `rlfleet up`, leaving the same run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .helpers import REPO, metric_records

USERLAND = REPO / "tests" / "userland"


def test_single_runs_a_commander_and_learner_hooks(tmp_path):
    run_dir = tmp_path / "run"
    hook_out = tmp_path / "hook.json"
    hooks = json.dumps([{"path": "my_rl:FirstHook", "priority": -1},
                        {"path": "my_rl:CountingHook", "params": {"out": str(hook_out)}}])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(USERLAND), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet", "single", "--config",
         str(REPO / "configs" / "corridor-curriculum.yaml"), "--run-dir", str(run_dir),
         f"learner.hooks={hooks}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert proc.returncode == 0, f"{summary}\n{proc.stderr[-3000:]}"
    assert summary["solved"] is True and summary["mode"] == "single", summary

    # the commander moved the evaluations from 4 cells to 16, in order, and is logged
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    walked = [e["deterministic"]["info"]["corridor_length"] for e in evaluations]
    assert walked == sorted(walked) and set(walked) == {4.0, 8.0, 16.0}, walked
    assert any(r["scope"] == "info" and "commander/length" in r
               for r in metric_records(run_dir))

    # the hooks ran at their stages, in priority order, on the learner's rank 0, and what
    # CountingHook added to the metrics was logged like the policy's own
    seen = json.loads(hook_out.read_text())
    assert seen["order"] == ["first.before_run", "counting.before_run", "first.after_run",
                             "counting.after_run"], seen
    assert seen["rank"] == 0 and seen["updates"] > 0
    assert seen["train_iterations"] == summary["train_iterations"] - seen["started_at"] \
        or seen["train_iterations"] >= seen["updates"]
    assert any("train/hook_batch_rows" in r for r in metric_records(run_dir))


def test_single_keeps_the_batch_log(tmp_path):
    """`logging.batch_log` under `rlfleet single`: the coordinator counts every sample it
    hands the learner, and the learner's logged values reach `batch_log.jsonl`, as under
    `rlfleet up` (tests/integration/test_batch_log.py)."""
    from rlfleet.shared.telemetry.rundata import load_run

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlfleet", "single", "--config",
         str(REPO / "configs" / "cartpole-dqn.yaml"), "--run-dir", str(run_dir),
         "stop.max_env_steps=6000", "eval.every_env_steps=3000",
         "logging.batch_log.every_train_iterations=50",
         "logging.batch_log.samples_per_update=32"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_iterations"] > 100, summary

    run = load_run(run_dir)
    sampled = int(run.samples["times_sampled"].sum())
    # every batch the learner trained on was counted; granted but not trained (the run
    # ended between the two) at most one request's worth more
    assert sampled % 64 == 0 and sampled >= summary["train_iterations"] * 64, sampled
    assert sampled <= (summary["train_iterations"] + 64) * 64, sampled
    logged = run.batch_log
    assert len(logged) > 0 and {"td_error", "q"} <= set(logged.columns)
    assert set(logged["train_iteration"] % 50) == {0}
    assert logged.groupby("train_iteration").size().max() <= 32
