"""Chaos for the learner group: a real `rlfleet up` with learners training as one group.

- One of 2 learners (the publisher, rank 0) is SIGKILLed mid-run: the survivor goes on in a
  re-formed group, the supervisor's restart of the dead one joins again, and the run solves.
- A learner added mid-run (`rlfleet scale --learners 2`) is taken into the group.

Throughout, the ledger must balance, no chunk may be indexed twice, and policy versions may
only go up. PPO is the workload: its rollouts are whole queue chunks held by the group, the
case where a death must give chunks back. It solves CartPole in seconds, faster than a
learner process starts, so each test pauses collection (`POST /run/pause`, as an operator
would) while the group changes and resumes it once the group has formed: the learners go on
with what is queued, and the run cannot end before the change is seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml
from integration.helpers import REPO, _merge, wait_for

from .harness import Monitor, Run

FIRST_EVAL = 20_000  # env steps: every fault happens before the run may be solved


def group_config(path: Path) -> Path:
    data = yaml.safe_load((REPO / "configs" / "cartpole-ppo.yaml").read_text())
    data = _merge(data, {
        # Fast failure detection: a dead learner is reaped within seconds.
        "coordinator": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0,
                        "snapshot_interval_s": 2.0},
        "learner": {"collective_timeout_s": 10.0},
        "checkpoint": {"every_train_iterations": 50},
        "eval": {"start_env_steps": FIRST_EVAL},
        "stop": {"max_wall_s": 300},
    })
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Versions:
    """Polls the run's policy version: it must never go down."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.highest = -1
        self.violations: list[str] = []
        self.stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(Exception):
                v = self.run.status()["counters"]["policy_version"]
                if v < self.highest:
                    self.violations.append(f"policy version went from {self.highest} to {v}")
                self.highest = max(self.highest, v)


def group_of(run: Run) -> dict:
    return run.status()["learner_group"]


def collection(run: Run, action: str) -> None:
    r = run.http.post(f"{run.url}/api/v1/run/{action}", timeout=5)
    r.raise_for_status()


def stop_run(run: Run, monitor: Monitor, versions: Versions) -> None:
    """Teardown, whatever happened: stop the pollers, and the run if it still goes."""
    monitor.stop.set()
    versions.stop.set()
    if run.up.proc.poll() is None:
        run.up.proc.send_signal(signal.SIGINT)
    with contextlib.suppress(Exception):
        run.up.wait(60)


def finish(run: Run, monitor: Monitor, versions: Versions, what: str, changed_at: int) -> dict:
    """Waits for the run to solve; the monitor must have checked the ledger all along, and
    again after the group changed (`changed_at`: its answers when collection resumed).

    Its answer count is a guard that it ran, not a rate: on a loaded 2-core machine one
    /status answer may take a second, and the run after the change lasts seconds."""
    code = run.up.wait(240)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert code == 0 and summary["solved"], (
        f"{what}: exit {code}, summary {summary}\n{run.up.stderr[-3000:]}")
    monitor.stop.set()
    versions.stop.set()
    assert not monitor.violations, monitor.violations[:5]
    assert not versions.violations, versions.violations[:5]
    assert monitor.answers >= 5 and monitor.answers > changed_at, (monitor.answers, changed_at)
    assert monitor.chunk_checks >= 1, monitor.chunk_checks
    return summary


def test_a_killed_learner_leaves_the_group_which_reforms_and_the_run_solves(tmp_path, launch):
    run_dir = tmp_path / "run"
    up = launch("--config", str(group_config(tmp_path / "group.yaml")), "--collectors", "2",
                "--learners", "2", "--run-dir", str(run_dir), "--quiet", "--max-restarts", "3")
    run = Run(up, run_dir)
    monitor = Monitor(run)
    versions = Versions(run)
    try:
        wait_for(lambda: group_of(run)["world_size"] == 2, 90, "a group of two learners")
        monitor.start()
        wait_for(lambda: run.status()["counters"]["env_steps"] >= 4000, 120, "env step 4000")
        wait_for(lambda: run.status()["counters"]["train_iterations"] >= 60, 60,
                 "the publisher's first checkpoint")
        before = group_of(run)
        version = run.status()["counters"]["policy_version"]
        publisher, survivor = [r["worker_id"] for r in before["ranks"]]
        collection(run, "pause")
        run.kill("learner", publisher)  # rank 0

        # The survivor went on alone in a new generation, with rank 0's role ...
        def survivor_alone() -> bool:
            return any(h["generation"] > before["generation"] and h["ranks"] == [survivor]
                       for h in group_of(run)["history"])
        wait_for(survivor_alone, 60, "a generation of the survivor alone")
        # ... then the restarted learner joined it again, behind the survivor
        wait_for(lambda: [r["worker_id"] for r in group_of(run)["ranks"]]
                 == [survivor, publisher], 90, "the restarted learner back in the group")
        collection(run, "resume")
        changed_at = monitor.answers
        wait_for(lambda: run.status()["counters"]["policy_version"] > version + 2, 60,
                 "new policy versions from the new publisher")
        summary = finish(run, monitor, versions, "learner killed", changed_at)
        assert summary["restarts"] == {publisher: 1}
        reasons = summary["learner_group"]["reformations_by_reason"]
        assert set(reasons) & {"died", "unresponsive", "collective failed",
                               "registered again"}, reasons
        survivor_log = (run_dir / "logs" / f"{survivor}.log").read_text()
        assert "formed: rank 0 of 1" in survivor_log and "broke" in survivor_log
    finally:
        stop_run(run, monitor, versions)


def test_a_learner_that_joins_mid_run_is_taken_into_the_group(tmp_path, launch):
    run_dir = tmp_path / "run"
    up = launch("--config", str(group_config(tmp_path / "group.yaml")), "--collectors", "2",
                "--learners", "1", "--run-dir", str(run_dir), "--quiet")
    run = Run(up, run_dir)
    monitor = Monitor(run)
    versions = Versions(run)
    try:
        wait_for(lambda: run.status()["counters"]["env_steps"] >= 3000, 120, "env step 3000")
        monitor.start()
        assert group_of(run)["world_size"] == 1
        collection(run, "pause")
        scale = subprocess.run(
            [sys.executable, "-m", "rlfleet", "scale", "--learners", "2",
             "--coordinator", run.url], cwd=REPO, capture_output=True, text=True, timeout=30)
        assert scale.returncode == 0, scale.stderr
        assert "learners wanted: 2" in scale.stdout
        wait_for(lambda: [r["worker_id"] for r in group_of(run)["ranks"]]
                 == ["learner", "learner-2"], 90, "learner-2 taken into the group")
        iterations = run.status()["counters"]["train_iterations"]
        collection(run, "resume")
        changed_at = monitor.answers
        wait_for(lambda: run.status()["counters"]["train_iterations"] > iterations + 100, 90,
                 "training going on in the group of two")
        summary = finish(run, monitor, versions, "learner joined", changed_at)
        assert summary["learner_group"]["world_size"] == 2
        log = (run_dir / "logs" / "learner-2.log").read_text()
        assert "formed: rank 1 of 2" in log
        # it adopted the group's state: it did not start from scratch
        formed = [line for line in log.splitlines() if "formed: rank 1 of 2" in line][0]
        assert "train iteration 0," not in formed, formed
    finally:
        stop_run(run, monitor, versions)


def test_a_hung_learner_is_left_behind_and_rejoins_when_it_wakes(tmp_path, launch):
    """SIGSTOP the publisher: the group re-forms without it (the survivor's all-reduce times
    out and the coordinator finds it silent, or its heartbeats stop); after SIGCONT the woken
    learner cannot publish a version the survivor already did, and it joins again."""
    run_dir = tmp_path / "run"
    config = group_config(tmp_path / "group.yaml")
    data = yaml.safe_load(config.read_text())
    data["learner"]["collective_timeout_s"] = 4.0
    # long enough that the hung learner is not declared dead before its collective fails
    data["coordinator"]["heartbeat_timeout_s"] = 10.0
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    up = launch("--config", str(config), "--collectors", "2", "--learners", "2",
                "--run-dir", str(run_dir), "--quiet", "--max-restarts", "0")
    run = Run(up, run_dir)
    monitor = Monitor(run)
    versions = Versions(run)
    hung: list[int] = []
    try:
        wait_for(lambda: group_of(run)["world_size"] == 2, 90, "a group of two learners")
        monitor.start()
        wait_for(lambda: run.status()["counters"]["train_iterations"] >= 60, 120,
                 "training in the group")
        before = group_of(run)
        publisher, survivor = [r["worker_id"] for r in before["ranks"]]
        collection(run, "pause")
        hung = run.pids("learner", publisher)
        for pid in hung:
            os.kill(pid, signal.SIGSTOP)

        def survivor_alone() -> bool:
            g = group_of(run)
            return g["generation"] > before["generation"] and \
                [r["worker_id"] for r in g["ranks"]] == [survivor]
        wait_for(survivor_alone, 60, "the survivor alone in a new generation")
        version = run.status()["counters"]["policy_version"]
        for pid in hung:
            os.kill(pid, signal.SIGCONT)
        hung = []
        wait_for(lambda: sorted(r["worker_id"] for r in group_of(run)["ranks"])
                 == sorted([survivor, publisher]), 90, "the woken learner back in the group")
        collection(run, "resume")
        changed_at = monitor.answers
        wait_for(lambda: run.status()["counters"]["policy_version"] > version + 2, 60,
                 "new policy versions")
        summary = finish(run, monitor, versions, "learner hung", changed_at)
        assert summary["restarts"] == {}  # nothing crashed: it was only stopped
        # Noticed either way: by the survivor's all-reduce timing out (then "unresponsive" or
        # "collective failed"), or, when the hang caught no collective in flight (collection
        # was paused), by its heartbeats stopping ("died"). The timeout path alone is in
        # tests/unit/test_data_parallel.py.
        reasons = summary["learner_group"]["reformations_by_reason"]
        assert set(reasons) & {"collective failed", "unresponsive", "died"}, reasons
    finally:
        for pid in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_run(run, monitor, versions)
