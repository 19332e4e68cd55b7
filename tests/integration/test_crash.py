"""A user's env that raises in `step()`, through `rlfleet up`: the failure is explained.

- The collector exits non-zero, and the console shows the exception's last line at the first
  restart.
- The same error coming back ends the run early (not after every restart), with the
  exception, its traceback and the failing role in summary.json.
- An env crash in an evaluation is reported as one: the evaluation's task fails with it.
- Console lines are whole when stderr is a pipe (no wrapping at 80 columns), and
  summary.json records the seed the run used, which came from the config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .helpers import REPO, small_config

USERLAND = REPO / "tests" / "userland"
MESSAGE = "the simulator lost its licence"


def _crashing_run(launch, tmp_path: Path, **kwargs) -> tuple[int, dict, str, Path]:
    config = small_config(tmp_path / "crash.yaml",
                          env={"id": "my_rl:CrashingCartPole", "kwargs": kwargs},
                          eval={"every_env_steps": 1000})
    # A deep run directory: its path is longer than 80 columns.
    run_dir = tmp_path / ("a-run-directory-with-a-long-name-" * 2) / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=150)
    summary = json.loads((run_dir / "summary.json").read_text())
    up.assert_no_orphans()
    return code, summary, up.stderr, run_dir


def test_an_env_that_always_raises_ends_the_run_early_with_its_error(launch, tmp_path):
    code, summary, stderr, run_dir = _crashing_run(launch, tmp_path)
    assert code == 1, stderr[-3000:]
    assert summary["outcome"] == "crashed"
    crash = summary["crash"]
    assert crash["child"] == "collector-1" and crash["role"] == "collector"
    assert crash["where"] == "collection" and crash["exit_code"] == 1
    assert crash["type"] == "RuntimeError" and crash["message"] == MESSAGE
    assert "in step" in crash["traceback"] and "raise RuntimeError" in crash["traceback"]
    # The first restart already says why; the third identical error ends the run, not the
    # tenth restart.
    assert (f"exited with code 1 in collection: RuntimeError: {MESSAGE}: restarting (1/10)"
            in stderr), stderr[-3000:]
    assert summary["restarts"] == {"collector-1": 2}
    assert "the same error 3 times, giving up" in summary["error"]
    assert f"RuntimeError: {MESSAGE}" in summary["error"]
    # Whole lines in a pipe, and the seed the config gave.
    assert f"run dir {run_dir}" in stderr
    assert isinstance(summary["seed"], int)


def test_an_env_crash_in_an_evaluation_is_reported_as_one(launch, tmp_path):
    code, summary, stderr, run_dir = _crashing_run(launch, tmp_path, in_eval_only=True)
    assert code == 1, stderr[-3000:]
    crash = summary["crash"]
    assert crash["where"].startswith("evaluation evaluate-"), crash
    assert crash["message"] == MESSAGE
    task = crash["where"].split(" ", 1)[1]
    coordinator = (run_dir / "logs" / "coordinator.log").read_text()
    assert (f"task {task} failed on collector-1: evaluation crashed: RuntimeError: {MESSAGE}"
            in coordinator), coordinator[-3000:]
    # Each restart's evaluation is another task: the first restart names its own.
    assert re.search(rf"exited with code 1 in evaluation evaluate-\d+: RuntimeError: {MESSAGE}: "
                     r"restarting \(1/10\)", stderr), stderr[-3000:]
