"""Scaling a running `rlfleet up`: `rlfleet scale --collectors N` adds collectors that register
and collect within seconds, and drains the ones it removes (their last chunks written and
reported, their tasks finished) while the run goes on. The env sleeps 2 ms a step,
like a slow simulator, so collectors, not the two cores, limit env steps/s."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import requests
import yaml

from rlfleet.shared.contract.wire.base import API

from .helpers import REPO, wait_for

USERLAND = REPO / "tests" / "userland"


def _status(url: str) -> dict:
    return requests.get(f"{url}{API}/status", timeout=5).json()


def _collectors(status: dict, state: str = "alive") -> list[dict]:
    return [w for w in status["workers"] if w["role"] == "collector" and w["state"] == state]


def _scale(url: str, n: int) -> None:
    out = subprocess.run([sys.executable, "-m", "rlfleet", "scale", "--collectors", str(n),
                          "--coordinator", url], cwd=REPO, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"collectors wanted: {n}" in out.stdout


def _steady_rate(url: str, collectors: int) -> float:
    """env steps/s over the coordinator's 5 s window, once `collectors` have been collecting
    for all of it."""
    wait_for(lambda: len(_collectors(_status(url))) == collectors, 60,
             f"{collectors} collectors alive")

    def each_collecting() -> bool:
        return all(w["status"].get("env_steps", 0) > 0 for w in _collectors(_status(url)))

    wait_for(each_collecting, 60, "every collector to report env steps")
    first = _status(url)["counters"]["env_steps"]
    wait_for(lambda: _status(url)["counters"]["env_steps"] > first + 3000, 60,
             "3000 more env steps")
    start = _status(url)
    wait_for(lambda: _status(url)["run"]["wall_seconds"] > start["run"]["wall_seconds"] + 4,
             30, "a 4 s window")
    end = _status(url)
    return ((end["counters"]["env_steps"] - start["counters"]["env_steps"])
            / (end["run"]["wall_seconds"] - start["run"]["wall_seconds"]))


@pytest.mark.timeout(600)
def test_scale_up_and_down_while_training(launch, tmp_path):
    data = yaml.safe_load((REPO / "configs" / "cartpole-ppo.yaml").read_text())
    # 1 ms a step: one collector makes about 900 env steps/s, far below what the PPO learner
    # consumes, so nothing holds collectors back and env steps/s follow their number.
    data["env"] = {"id": "my_rl:SlowCartPole", "num_envs": 8, "kwargs": {"step_s": 0.001}}
    # No evaluation before 40,000 env steps: the run cannot stop (solved) in the middle.
    data["eval"].update(every_env_steps=40_000)
    data["stop"] = {"max_wall_s": 420}
    config = tmp_path / "slow.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", "--collector-nice", "0", env={"PYTHONPATH": str(USERLAND)})
    url = wait_for(lambda: _coordinator_url(run_dir), 60, "the coordinator's URL")

    one = _steady_rate(url, 1)
    _scale(url, 3)
    three = _steady_rate(url, 3)
    assert three > 1.6 * one, (one, three)

    _scale(url, 1)
    wait_for(lambda: len(_collectors(_status(url), "left")) == 2, 60,
             "the two removed collectors to drain and leave")
    status = _status(url)
    assert len(_collectors(status)) == 1 and status["run"]["state"] == "running"
    removed = _collectors(status, "left")
    for worker in removed:
        log = (run_dir / "logs" / f"{worker['worker_id']}.log").read_text()
        written, reported = map(int, re.search(
            r"drained: (\d+) chunks written, (\d+) reported", log).groups())
        # everything it wrote was reported, and the coordinator took every one of them
        assert written == reported == worker["chunks_accepted"] > 0, worker
        tasks = requests.get(f"{url}{API}/tasks", timeout=5).json()["tasks"]
        mine = [t for t in tasks if t["worker_id"] == worker["worker_id"]]
        assert mine and all(t["state"] == "finished" for t in mine), mine
    # every chunk the coordinator accepted went into the queue (then used by the learner,
    # or dropped as too stale, counted by reason)
    queue = status["buffers"]["rollouts"]
    assert queue["inserted_chunks"] == status["counters"]["chunks_accepted"]
    assert set(k for k in queue if k.startswith("dropped/")) <= {"dropped/policy_lag"}

    # The run goes on with the one collector left; then it is stopped by request (a run that
    # scales and then solves: tests/slurm, tests/compose), and every process it started ends.
    before = status["counters"]["env_steps"]
    wait_for(lambda: _status(url)["counters"]["env_steps"] > before + 2000, 60,
             "the run to go on after the scale-down")
    requests.post(f"{url}{API}/run/stop", timeout=5).raise_for_status()
    code = up.wait(timeout=120)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "stopped by request"
    assert "draining" in up.stderr
    up.assert_no_orphans()


def _coordinator_url(run_dir) -> str | None:
    """From the first collector's log line `registered as collector-1 with <url>`."""
    log = run_dir / "logs" / "collector-1.log"
    m = re.search(r"registered as \S+ with (http://\S+)", log.read_text()) \
        if log.exists() else None
    return m.group(1) if m else None
