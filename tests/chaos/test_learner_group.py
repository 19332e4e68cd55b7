"""Chaos for the learner group: a real `rlfleet up` with learners training as one group.

- One of 2 learners (the publisher, rank 0) is SIGKILLed mid-run: the survivor goes on in a
  re-formed group, the supervisor's restart of the dead one joins again, and the run solves.
- A learner added mid-run (`rlfleet scale --learners 2`) is taken into the group.
- The publisher is SIGSTOPped mid-run: the coordinator declares it dead after its heartbeat
  timeout, the survivor stops waiting for it in the all-reduce and trains again within that
  timeout plus a second; woken, the frozen learner joins again.

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
import time
from pathlib import Path

import yaml
from integration.helpers import REPO, _merge, proc_cmdline, wait_for

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
        # the killed learner, once; a collector restarted on a loaded machine (a lapsed
        # heartbeat) is the supervisor doing its job, not what this test is about
        learners = {w: n for w, n in summary["restarts"].items() if w.startswith("learner")}
        assert learners == {publisher: 1}, summary["restarts"]
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


def worker_url(run: Run, worker_id: str) -> str:
    """A worker's own HTTP service, from the `--port` `rlfleet up` gave it."""
    pids = run.pids("learner", worker_id)
    assert pids, f"no process of {worker_id}"
    args = proc_cmdline(pids[0]).split()
    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"


class Watch:
    """Times, from a freeze: when the coordinator declared the frozen worker dead, and when
    the survivor finished its next learn round (a PPO round all-reduces with every rank)."""

    def __init__(self, run: Run, frozen: str, survivor_url: str) -> None:
        self.run, self.frozen, self.survivor_url = run, frozen, survivor_url
        self.frozen_at = time.monotonic()
        self.declared_dead_s: float | None = None
        self.trained_s: float | None = None
        self.rounds: int | None = None  # the survivor's learn rounds once frozen ones settled
        threading.Thread(target=self._loop, daemon=True, name="freeze-watch").start()

    def _learn_rounds(self) -> int:
        r = self.run.http.get(f"{self.survivor_url}/status", timeout=3)
        r.raise_for_status()
        return r.json()["learn_rounds"]

    def _loop(self) -> None:
        while self.trained_s is None and time.monotonic() - self.frozen_at < 60:
            with contextlib.suppress(Exception):
                since = time.monotonic() - self.frozen_at
                if self.declared_dead_s is None and \
                        self.run.get(f"/workers/{self.frozen}")["state"] == "dead":
                    self.declared_dead_s = since
                rounds = self._learn_rounds()
                if self.rounds is None:
                    if since >= 0.3:  # a round the freeze did not catch has ended by now
                        self.rounds = rounds
                elif rounds > self.rounds:
                    self.trained_s = time.monotonic() - self.frozen_at
            time.sleep(0.05)


def test_a_hung_learner_is_left_behind_and_rejoins_when_it_wakes(tmp_path, launch):
    """SIGSTOP the publisher while the group trains: the coordinator declares it dead after
    its heartbeat timeout and re-forms the group, and the survivor stops waiting in the
    all-reduce then, not at the collective's timeout (30 s): it trains again within the
    heartbeat timeout plus a second of the freeze. After SIGCONT the woken learner cannot
    publish a version the survivor already did, and it joins again."""
    run_dir = tmp_path / "run"
    config = group_config(tmp_path / "group.yaml")
    data = yaml.safe_load(config.read_text())
    data["learner"]["collective_timeout_s"] = 30.0  # the default: the heartbeat decides
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    heartbeat_timeout_s = data["coordinator"]["heartbeat_timeout_s"]
    up = launch("--config", str(config), "--collectors", "2", "--learners", "2",
                "--run-dir", str(run_dir), "--quiet", "--max-restarts", "0")
    run = Run(up, run_dir)
    monitor = Monitor(run)
    versions = Versions(run)
    hung: list[int] = []
    try:
        wait_for(lambda: group_of(run)["world_size"] == 2, 90, "a group of two learners")
        monitor.start()
        # 60 updates more than when the group of two was declared: it has formed (the
        # ranks' rendezvous is done) and trains. A freeze before that hangs the forming,
        # which waits out the collective's timeout (a known limit), and a lone first
        # learner may already have passed any fixed count.
        formed_at = run.status()["counters"]["train_iterations"]
        wait_for(lambda: run.status()["counters"]["train_iterations"] >= formed_at + 60,
                 120, "training in the group")
        before = group_of(run)
        publisher, survivor = [r["worker_id"] for r in before["ranks"]]
        survivor_url = worker_url(run, survivor)
        hung = run.pids("learner", publisher)
        for pid in hung:
            os.kill(pid, signal.SIGSTOP)
        watch = Watch(run, publisher, survivor_url)
        wait_for(lambda: watch.trained_s is not None, 60, "the survivor training again")
        collection(run, "pause")  # from here on the run must not end before the rejoin
        assert watch.declared_dead_s is not None, "the frozen learner was not declared dead"
        print(f"frozen rank: declared dead after {watch.declared_dead_s:.2f}s, the survivor "
              f"trained again after {watch.trained_s:.2f}s (heartbeat timeout "
              f"{heartbeat_timeout_s}s)")
        assert watch.trained_s <= heartbeat_timeout_s + 1.0, (
            f"the survivor trained again {watch.trained_s:.2f}s after the freeze "
            f"(declared dead at {watch.declared_dead_s:.2f}s)")
        g = group_of(run)
        assert g["generation"] > before["generation"]
        assert [r["worker_id"] for r in g["ranks"]] == [survivor]

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
        reasons = summary["learner_group"]["reformations_by_reason"]
        assert "died" in reasons, reasons  # by its heartbeats, not the collective's timeout
    finally:
        for pid in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_run(run, monitor, versions)
