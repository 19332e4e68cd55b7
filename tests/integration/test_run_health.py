"""Runs that report honestly and survive their users' code, through `rlfleet up`:

- a policy whose metric goes NaN every third update and which reports an array metric: the
  reports still arrive, the NaNs are counted (`train/nonfinite_metrics`) and said in
  `GET /status`, `rlfleet status` and `summary.json`; the array reaches the logger, which
  reduces it; train records are means over their interval, written every N train iterations;
- a learner with no data (no collectors yet) raises a data-shortage alert, which goes once
  collectors feed it;
- a learner that dies of an exception, and one stopped with SIGTERM, each leave a checkpoint
  of where they were, and their restart resumes from it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient

from .helpers import (
    REPO,
    checkpoint_index,
    config_from,
    coordinator_url,
    marked_env,
    metric_records,
    role_of,
    wait_for,
)

USERLAND = REPO / "tests" / "userland"


def status_of(url: str) -> dict:
    client = HttpClient(url, timeout_s=5, retries=1)
    try:
        return client.get(f"{API}/status")
    finally:
        client.close()


def alerts(url: str, kind: str) -> list[dict]:
    return [a for a in status_of(url)["alerts"] if a["kind"] == kind]


def test_nan_and_array_metrics_and_a_data_shortage_are_reported(launch, tmp_path):
    every = 150
    config = config_from(
        tmp_path, "cartpole-dqn.yaml",
        algo={"policy": "my_rl:NaNMetricDQN", "eps_decay_steps": 2000},
        learner={"data_shortage_warn_s": 1.5},
        logging={"scopes": {"train": {"every_train_iterations": every, "min_max": True,
                                      "arrays": "minmeanmax"}}},
        eval={"every_env_steps": 4000, "episodes": 2, "num_envs": 2, "stop_value": None},
        stop={"max_env_steps": 5000, "max_wall_s": 120})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "0", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    url = wait_for(lambda: coordinator_url(up), 60, "the coordinator's URL")
    # no collector: the learner starves, and says so
    shortage = wait_for(lambda: alerts(url, "data_shortage"), 60, "a data-shortage alert")
    assert shortage[0]["worker_id"] == "learner" and shortage[0]["waited_s"] >= 1.5
    scaled = subprocess.run([sys.executable, "-m", "rlfleet", "scale", "--coordinator", url,
                             "--collectors", "1"], cwd=REPO, capture_output=True, text=True,
                            timeout=30, env=marked_env(up.marker))
    assert scaled.returncode == 0, scaled.stderr
    # fed again: the alert goes; the NaNs of the policy's metric are counted and said
    wait_for(lambda: not alerts(url, "data_shortage") and alerts(url, "nonfinite_metrics"),
             90, "the shortage to end and the NaN metric to be said")
    shown = subprocess.run([sys.executable, "-m", "rlfleet", "status", "--coordinator", url],
                           cwd=REPO, capture_output=True, text=True, timeout=30,
                           env={**marked_env(up.marker), "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "alert (nonfinite_metrics)" in shown.stdout and "wobble" in shown.stdout
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"  # stopped by its budget

    summary = json.loads((run_dir / "summary.json").read_text())
    (nan,) = [a for a in summary["alerts"] if a["kind"] == "nonfinite_metrics"]
    assert nan["metrics"]["wobble"] > 0 and set(nan["metrics"]) == {"wobble"}
    train = [r for r in metric_records(run_dir) if r["scope"] == "train"]
    assert len(train) >= 3
    for r in train:
        # the interval's mean of the finite values: never NaN, never a sample
        assert r["train/wobble"] == 1.0 and r["train/wobble_min"] == 1.0
        assert r["train/loss_min"] <= r["train/loss"] <= r["train/loss_max"]
        # the array metric [1, 2, n % 5], reduced by the logger (`arrays: minmeanmax`)
        assert r["train/q_per_action_min"] <= 1.0 and r["train/q_per_action_max"] >= 2.0
        assert 1.0 <= r["train/q_per_action_mean"] <= 7 / 3
    counts = [r["train/nonfinite_metrics"] for r in train]
    assert counts == sorted(counts) and counts[-1] > 0
    # written every `every` train iterations, not by env steps; the run log's close may add
    # one record of the last, shorter stretch
    its = [r["train/train_iterations"] for r in train]
    assert all(b - a >= every for a, b in zip(its, its[1:-1], strict=False)), its
    assert its[-1] > its[-2] and its[-1] <= summary["train_iterations"], its
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert learner_log.count("metric 'wobble' was not finite") == 1  # once per key
    assert "no data for" in learner_log and "data arrives again" in learner_log
    up.assert_no_orphans()


def learner_pid(up) -> int | None:
    return next((p for p in up.descendants() if role_of(p) == "learner"), None)


def resumed_from(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"resumed from checkpoint at train iteration (\d+)",
                                       log)]


def test_a_learner_killed_by_an_exception_or_sigterm_resumes_from_where_it_was(
        launch, tmp_path):
    marker = tmp_path / "crashed"
    config = config_from(
        tmp_path, "cartpole-dqn.yaml",
        algo={"policy": "my_rl:CrashingDQN", "eps_decay_steps": 2000,
              "params": {"crash_at": 300, "marker": str(marker)}},
        # no periodic checkpoint in this run: what is saved is saved on the way down
        checkpoint={"every_train_iterations": 1_000_000},
        # never solved: the run must still be training when the learner gets SIGTERM
        eval={"every_env_steps": 4000, "episodes": 2, "num_envs": 2, "stop_value": None},
        stop={"max_env_steps": 12_000, "max_wall_s": 150})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    log_path = run_dir / "logs" / "learner.log"

    def log() -> str:
        return log_path.read_text() if log_path.exists() else ""

    # the exception: a checkpoint at the iteration it died at, and the restart resumes there
    wait_for(lambda: resumed_from(log()), 90, "the crashed learner's restart to resume")
    crashed_at = int(marker.read_text())
    assert resumed_from(log()) == [crashed_at] and crashed_at == 299
    assert "checkpoint saved on the way down at train iteration 299" in log()
    assert [c["train_iterations"] for c in checkpoint_index(run_dir)] == [299]

    # SIGTERM: the learner stops in order, saving where it was
    url = wait_for(lambda: coordinator_url(up), 10, "the coordinator's URL")
    wait_for(lambda: status_of(url)["counters"]["train_iterations"] >= crashed_at + 300, 60,
             "the restarted learner to train on")
    pid = wait_for(lambda: learner_pid(up), 10, "the learner's process")
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: len(resumed_from(log())) == 2, 60, "the stopped learner's restart")
    stopped_at = resumed_from(log())[1]
    assert stopped_at > crashed_at + 300
    assert stopped_at in [c["train_iterations"] for c in checkpoint_index(run_dir)]
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"].get("learner") == 2 and summary["train_iterations"] > stopped_at
    assert Path(run_dir / "logs" / "learner.log").exists()
    up.assert_no_orphans()
