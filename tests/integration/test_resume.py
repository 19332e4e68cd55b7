"""A run killed mid-training (SIGKILL of every process, no chance to save anything) and
continued with `rlfleet resume`: counters, buffers, checkpoints and curves carry on as if
it had never stopped, and the run still reaches its stop value. Then `rlfleet plot`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.shared.telemetry.rundata import load_run

from .helpers import REPO, checkpoint_index, marked_env, metric_records, small_config, wait_for

INTERVALS = {"collect": 1000, "train": 1000, "update": 1000, "info": 2000}


def test_a_killed_run_resumes_and_solves_with_consistent_curves(launch, tmp_path):
    config = small_config(
        tmp_path / "resume.yaml",
        coordinator={"snapshot_interval_s": 1.0},
        checkpoint={"every_train_iterations": 300, "keep_last": 2},
        logging={"scopes": {name: {"every_env_steps": n} for name, n in INTERVALS.items()}
                 | {"eval": {"every_env_steps": 0}}},
        eval={"every_env_steps": 2000, "episodes": 10, "num_envs": 10, "stop_value": 475},
        stop={"max_env_steps": 400_000, "max_wall_s": 240})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")

    def trained_a_while() -> bool:
        train = [r for r in metric_records(run_dir) if r["scope"] == "train"]
        return (len(train) >= 6 and len(checkpoint_index(run_dir)) >= 1
                and (run_dir / "storage" / "blobs" / "snapshot.coordinator").exists())

    wait_for(trained_a_while, 120, "a few train records, a checkpoint and a snapshot")
    # SIGKILL everything at once: nothing gets to save on the way out
    pids = [up.proc.pid, *up.descendants()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    up.proc.wait(timeout=30)
    wait_for(lambda: not up.descendants(), 15, "every killed process to be gone")
    before = metric_records(run_dir)
    steps_before = max(r["step"] for r in before)
    last_checkpoint = checkpoint_index(run_dir)[-1]["train_iterations"]

    resumed = subprocess.run(
        [sys.executable, "-m", "rlfleet", "resume", str(run_dir), "--quiet"], cwd=REPO,
        capture_output=True, text=True, timeout=300, env=marked_env(up.marker))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["eval_return"] >= 475
    assert summary["collectors"] == 2

    # the coordinator restored its last snapshot: counters no later than what was logged
    log = (run_dir / "logs" / "coordinator.log").read_text()
    restored = int(re.search(r"restored run at (\d+) env steps", log).group(1))
    assert 0 < restored <= steps_before + 4096
    assert summary["env_steps"] > restored
    # the learner continued from its last checkpoint, and went on from there
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert f"resumed from checkpoint at train iteration {last_checkpoint}" in learner_log
    assert summary["train_iterations"] > last_checkpoint

    # curves: per scope, steps strictly increase across the resume, and the gap the restart
    # leaves is no wider than the scope's usual spacing plus one interval (what was logged
    # after the last snapshot is gone; the first record after the restart comes at once),
    # plus a chunk from each collector: records are written as chunk reports arrive
    slack = summary["collectors"] * 128  # configs/cartpole-dqn.yaml's collector.chunk_size
    records = metric_records(run_dir)
    for scope, interval in INTERVALS.items():
        scoped = [r for r in records if r["scope"] == scope]
        steps = np.array([r["step"] for r in scoped])
        assert len(steps) > 3, scope
        gaps = np.diff(steps)
        assert (gaps > 0).all(), f"{scope}: steps not strictly increasing"
        at = int(np.searchsorted(steps, restored, side="right"))  # first record after it
        assert 0 < at < len(steps), f"{scope}: no records on both sides of the resume"
        usual = np.delete(gaps, at - 1).max()
        assert gaps[at - 1] <= usual + interval + slack + _first_episode(scoped[at], summary), \
            (scope, gaps[at - 1], usual)
    # nothing logged past the restored step survived from before the kill
    kept_before = [r for r in records if r["wall_time"] <= max(b["wall_time"] for b in before)]
    assert all(r["step"] <= restored for r in kept_before)
    run = load_run(run_dir)
    assert "eval/deterministic/return_mean" in run

    # TensorBoard holds the same curve without duplicated steps
    tb = EventAccumulator(str(run_dir / "tb"))
    tb.Reload()
    loss_steps = [e.step for e in tb.Scalars("train/loss")]
    assert len(loss_steps) == len(set(loss_steps))
    assert sorted(loss_steps) == [r["step"] for r in records
                                  if r["scope"] == "train" and "train/loss" in r]

    # and the picture
    out = tmp_path / "curves.png"
    plotted = subprocess.run([sys.executable, "-m", "rlfleet", "plot", str(run_dir),
                              "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert plotted.returncode == 0, plotted.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for series in ("eval/deterministic/return_mean", "collect/return_mean",
                   "timers/learner/update_ms", "timers/collector/env_step_ms"):
        assert series in plotted.stdout


def test_resuming_a_solved_run_says_it_is_finished(tmp_path):
    """A run that ended solved is not trained again by `rlfleet resume` (that only risked the
    policy it found); `--continue` is how to ask for more."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {"outcome": "solved", "solved": True, "eval_return": 500.0, "env_steps": 31000,
               "best_policy": str(run_dir / "best_policy.safetensors")}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    done = subprocess.run([sys.executable, "-m", "rlfleet", "resume", str(run_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "is finished: it was solved" in done.stdout and "--continue" in done.stdout
    assert json.loads((run_dir / "summary.json").read_text()) == summary  # nothing ran
    assert not (run_dir / "logs").exists()
    # --continue goes on to resume: this directory has no config, which it says.
    more = subprocess.run([sys.executable, "-m", "rlfleet", "resume", str(run_dir),
                           "--continue"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert more.returncode == 2 and "has no config.yaml" in more.stderr


def _first_episode(record: dict, summary: dict) -> float:
    """A collect record needs a finished episode, and the restarted collectors' envs all
    start new ones: the first collect record after the resume comes once the shortest of
    them ends, the env steps of every env of every collector until then (at most the mean
    length that record gives). The other scopes write their first record at once."""
    if record["scope"] != "collect":
        return 0.0
    num_envs = 4  # configs/cartpole-dqn.yaml's env.num_envs
    return summary["collectors"] * num_envs * record["collect/episode_length"]
