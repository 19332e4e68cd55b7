"""The Python API (`rlfleet.up`, `rlfleet.single`, `Run`): runs started, watched and stopped
from Python, one after another in one process, from any thread, each ending with the `Run`
or the process that holds it. Real launchers, real clusters, real CartPole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rlfleet
from rlfleet import ConfigError

from .helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_two_runs_one_after_the_other_one_stopped_one_solved(tmp_path: Path) -> None:
    # The first is started from a thread that ends at once: the run lives as long as its
    # `Run`, not as long as that thread.
    started: list[rlfleet.Run] = []
    starter = threading.Thread(target=lambda: started.append(rlfleet.up(
        "cartpole-dqn", collectors=1, runs_root=tmp_path,
        overrides={"eval.every_env_steps": 1000})))
    starter.start()
    starter.join()
    first = started[0]
    wait_for(lambda: first.status().env_steps >= 2000 or not first.running(), 180,
              "the first run collected 2000 env steps")
    assert first.running(), first.log_tail()
    assert first.status().state == "running"
    stopped = first.stop()
    assert stopped is not None and stopped["outcome"] == "interrupted", first.log_tail()
    assert first.returncode == 130 and first.status().state == "stopped"
    assert not first.metrics.empty and {"scope", "step"} <= set(first.metrics.columns)

    second = rlfleet.up("cartpole-dqn", collectors=2, runs_root=tmp_path,
                        overrides=["eval.episodes=8"])
    assert second.run_dir != first.run_dir
    summary = second.wait(timeout=280)
    assert summary is not None, f"not solved in time:\n{second.log_tail()}"
    assert summary["solved"] and second.returncode == 0, second.log_tail()
    assert second.status().state == "solved"
    evals = second.metrics
    evals = evals[evals["scope"] == "eval"]
    assert evals["eval/deterministic/return_mean"].max() >= 475
    # the override reached the run's resolved config, which every child read
    assert "episodes: 8" in (second.run_dir / "config.yaml").read_text()


def test_a_bad_override_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"algo\.lrr"):
        rlfleet.up("cartpole-dqn", runs_root=tmp_path, overrides={"algo.lrr": 1e-3})
    with pytest.raises(ConfigError, match="env.num_envs"):
        rlfleet.single("cartpole-dqn", runs_root=tmp_path,
                       overrides=["env.num_envs=many"])
    assert not any(tmp_path.iterdir())


def test_a_config_given_as_a_dict(tmp_path: Path) -> None:
    import yaml

    config = yaml.safe_load((REPO / "configs" / "cartpole-dqn.yaml").read_text())
    config["name"] = "from-a-dict"
    run = rlfleet.single(config, runs_root=tmp_path, overrides={"stop.max_env_steps": 3000})
    summary = run.wait(timeout=120)
    assert summary is not None and summary["outcome"] == "stopped", run.log_tail()
    assert run.run_dir.name.startswith("from-a-dict-")
    assert "max_env_steps: 3000" in (run.run_dir / "config.yaml").read_text()


DROPPER = """
import os, sys, time
import rlfleet
run = rlfleet.up("cartpole-dqn", collectors=1, runs_root=sys.argv[1])
print(run.pid, run.run_dir, flush=True)
deadline = time.monotonic() + 120
while run.status().env_steps == 0 and time.monotonic() < deadline:
    time.sleep(0.5)
if sys.argv[2] == "drop":
    del run            # the Run is collected: its run stops
    time.sleep(120)    # while this process goes on
else:
    os._exit(0)        # no atexit, no finalizers: the lifeline closes with the process
"""


@pytest.mark.parametrize("how", ["drop", "exit"])
def test_a_run_ends_with_its_run_object_or_its_process(tmp_path: Path, how: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", DROPPER, str(tmp_path), how],
                            stdout=subprocess.PIPE, text=True)
    try:
        pid_text, run_dir = proc.stdout.readline().split()
        launcher = int(pid_text)
        wait_for(lambda: _gone(launcher), 120, "the launcher stopped")
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        assert summary["outcome"] == "interrupted"
        if how == "drop":
            assert proc.poll() is None  # the Python process itself still runs
    finally:
        proc.kill()
        proc.wait()


def test_a_single_run_is_watched_and_stopped(tmp_path: Path) -> None:
    run = rlfleet.single("cartpole-dqn", runs_root=tmp_path,
                         overrides={"eval.every_env_steps": 500, "eval.stop_value": 10_000})

    def evaluations() -> int:
        metrics = run.metrics
        return int((metrics["scope"] == "eval").sum()) if len(metrics) else 0

    wait_for(lambda: evaluations() >= 2 or not run.running(), 120,
             "a single run's evaluations")
    assert run.status().state == "running", run.log_tail()
    summary = run.stop()
    assert summary is not None and summary["outcome"] == "interrupted", run.log_tail()
    assert run.returncode == 130
    assert evaluations() == summary["evaluations"] >= 2
