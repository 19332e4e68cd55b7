"""`rlfleet up` supervises its children: a collector or the learner killed outright
(SIGKILL of its whole process group, as the OOM killer or a lost node would) is started again
under its old worker id, registers again and the run carries on; the learner resumes from its
last checkpoint and publishes versions above every one published before, and no collector
ever goes back to an older policy. With `--max-restarts 0` the first crash ends the run.

The supervisor's own rules (back-off, the coordinator's port and `--resume`, the limit) are
tested on `LocalCluster.restart_crashed` directly, with the clock passed in. One run serves
both kills (each start of a cluster costs seconds of torch imports on two
cores). The config never stops on its own (no stop value, no env-step budget; `max_wall_s`
is only a safety net): the test stops it through `POST /api/v1/run/stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from rlfleet.local.launcher import LocalCluster, RestartsExhausted
from rlfleet.shared.contract.wire.base import API

from .helpers import (
    MARKER_VAR,
    REPO,
    Up,
    coordinator_url,
    marked_pids,
    proc_cmdline,
    proc_ppid,
    small_config,
    wait_for,
)

TOKEN = "supervise-test-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
CHECKPOINT_EVERY = 50


# -- reading the cluster ------------------------------------------------------------------

def _get(url: str, path: str) -> dict:
    resp = requests.get(f"{url}{path}", headers=HEADERS, timeout=5)
    resp.raise_for_status()
    return resp.json()


def _status(url: str) -> dict:
    return _get(url, f"{API}/status")


def _worker(status: dict, worker_id: str) -> dict:
    return next((w for w in status["workers"] if w["worker_id"] == worker_id), {})


def _own_status(url: str, worker_id: str) -> dict:
    """A worker's own `/status`, at the URL it registered last (a restarted worker's new
    port): what this process did, not what the coordinator remembers of the id."""
    return _get(_worker(_status(url), worker_id)["url"], "/status")


def _child_pid(up: Up, worker_id: str) -> int | None:
    """The pid of the child `rlfleet up` started for `worker_id`: its command line names
    the id, and the launcher is its parent."""
    for pid in up.descendants():
        if f"--worker-id {worker_id} " in proc_cmdline(pid) + " " and \
                proc_ppid(pid) == up.proc.pid:
            return pid
    return None


def _kill_group(pid: int) -> None:
    """SIGKILL a child and everything in its process group (the launcher gives each child
    its own): a learner and its data process at once."""
    os.killpg(pid, signal.SIGKILL)


def _checkpoints(run_dir: Path) -> list[int]:
    index = run_dir / "storage" / "blobs" / "ckpt-index"
    if not index.exists():
        return []
    with contextlib.suppress(json.JSONDecodeError):  # replaced while read
        return [c["train_iterations"] for c in json.loads(index.read_text())["checkpoints"]]
    return []


def _latest_published(run_dir: Path) -> int | None:
    """The newest policy version in directory storage (the file the learner replaces on each
    publish)."""
    try:
        return int((run_dir / "storage" / "weights" / "LATEST").read_text())
    except (OSError, ValueError):
        return None


class VersionWatch:
    """Polls, on a thread, every collector's own `/status` policy version (by URL: a restarted
    collector is a new process on a new port, starting from no policy) and the newest version
    in storage, so a step backwards between two test steps is seen."""

    def __init__(self, url: str, run_dir: Path, interval: float = 0.2) -> None:
        self.url, self.run_dir, self.interval = url, run_dir, interval
        self.collectors: dict[str, list[int]] = {}
        self.published: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> VersionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            latest = _latest_published(self.run_dir)
            if latest is not None:
                self.published.append(latest)
            with contextlib.suppress(requests.RequestException):
                for w in _status(self.url)["workers"]:
                    if w["role"] == "collector" and w["state"] == "alive":
                        self._sample(w["url"])

    def _sample(self, worker_url: str) -> None:
        with contextlib.suppress(requests.RequestException):
            version = _get(worker_url, "/status")["policy_version"]
            self.collectors.setdefault(worker_url, []).append(int(version))

    def collectors_above(self, version: int) -> bool:
        """Every collector alive now holds a version above `version`."""
        alive = [w["url"] for w in _status(self.url)["workers"]
                 if w["role"] == "collector" and w["state"] == "alive"]
        return bool(alive) and all(self.collectors.get(u, [-1])[-1] > version for u in alive)

    def backwards(self) -> dict[str, list[int]]:
        """Every series that ever decreased."""
        series = {"storage": self.published, **self.collectors}
        series = {name: list(s) for name, s in series.items()}  # the thread appends
        return {name: s for name, s in series.items()
                if any(b < a for a, b in zip(s, s[1:], strict=False))}


# -- the tests ------------------------------------------------------------------------------

def _config(tmp_path: Path) -> Path:
    return small_config(
        tmp_path / "supervise.yaml",
        checkpoint={"every_train_iterations": CHECKPOINT_EVERY},
        # no evaluations: nothing but the test stops this run
        eval={"every_env_steps": 10**9, "stop_value": None},
        stop={"max_env_steps": None, "max_wall_s": 150})


def _restarted(url: str, worker_id: str) -> dict:
    """The worker once it registered again and is alive."""
    w = _worker(_status(url), worker_id)
    return w if w.get("registrations", 0) >= 2 and w["state"] == "alive" else {}


# Slow: the chaos suite (tests/chaos) kills every role of `rlfleet up` and checks the restarts
# and the resumption in the default suite; this one adds the published versions' order.
@pytest.mark.slow
def test_a_killed_collector_and_learner_are_restarted_and_the_run_goes_on(launch, tmp_path):
    run_dir = tmp_path / "run"
    up = launch("--config", str(_config(tmp_path)), "--collectors", "2", "--run-dir",
                str(run_dir), "--quiet", env={"RLFLEET_TOKEN": TOKEN})
    url = wait_for(lambda: coordinator_url(up), 60, "the coordinator's URL")
    wait_for(lambda: _checkpoints(run_dir), 90, "the learner's first checkpoint")

    with VersionWatch(url, run_dir) as watch:
        # -- a collector ------------------------------------------------------------------
        collector_pid = wait_for(lambda: _child_pid(up, "collector-1"), 10, "collector-1")
        _kill_group(collector_pid)
        wait_for(lambda: _restarted(url, "collector-1"), 60,
                 "collector-1 to be restarted and register again")
        steps = _status(url)["counters"]["env_steps"]
        wait_for(lambda: _own_status(url, "collector-1")["env_steps"] > 0, 30,
                 "the restarted collector-1 to collect")
        wait_for(lambda: _status(url)["counters"]["env_steps"] > steps + 1000, 30,
                 "env steps to keep increasing")

        # -- the learner ------------------------------------------------------------------
        counters = _status(url)["counters"]
        before, trained = counters["policy_version"], counters["train_iterations"]
        learner_pid = wait_for(lambda: _child_pid(up, "learner"), 10, "the learner")
        _kill_group(learner_pid)
        wait_for(lambda: _child_pid(up, "learner") not in (None, learner_pid), 30,
                 "the learner to be started again")
        # The old learner is gone (the launcher reaped it) and the new one has not got as far
        # as publishing (that takes seconds of start-up): what storage holds now is every
        # version published before the kill, and the checkpoint the new one must resume from.
        published = max(_latest_published(run_dir) or -1, before)
        last_checkpoint = max(_checkpoints(run_dir))
        log = run_dir / "logs" / "learner.log"
        resumed = wait_for(lambda: re.search(r"resumed from checkpoint at train iteration "
                                             r"(\d+)", log.read_text()), 60,
                           "the restarted learner to resume from its checkpoint")
        at = int(resumed.group(1))
        assert at == last_checkpoint >= CHECKPOINT_EVERY
        wait_for(lambda: _restarted(url, "learner"), 30, "the learner to register again")
        wait_for(lambda: _status(url)["counters"]["policy_version"] > published, 60,
                 f"a policy version above {published}, the last one before the kill")
        assert _own_status(url, "learner")["resumed_from_iteration"] == at
        wait_for(lambda: _own_status(url, "learner")["train_iterations"] > trained, 60,
                 f"the restarted learner to train beyond {trained}, where the killed one was")
        wait_for(lambda: watch.collectors_above(published), 30,
                 "every collector to load a version published after the restart")

    assert watch.published and watch.collectors
    assert not watch.backwards(), f"a policy version went backwards: {watch.backwards()}"
    assert max(watch.published) > published

    requests.post(f"{url}{API}/run/stop", headers=HEADERS, timeout=5).raise_for_status()
    code = up.wait(timeout=60)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "stopped" and summary["error"] is None
    assert summary["restarts"] == {"collector-1": 1, "learner": 1}
    assert f"collector-1 (pid {collector_pid}) exited with code -9: restarting (1/10)" \
        in up.stderr
    assert f"learner (pid {learner_pid}) exited with code -9: restarting (1/10)" in up.stderr
    up.assert_no_orphans()


def test_with_max_restarts_0_a_killed_collector_ends_the_run(launch, tmp_path):
    run_dir = tmp_path / "run"
    up = launch("--config", str(_config(tmp_path)), "--collectors", "1", "--run-dir",
                str(run_dir), "--quiet", "--max-restarts", "0")
    pid = wait_for(lambda: _child_pid(up, "collector-1"), 60, "rlfleet up to start collector-1")
    _kill_group(pid)
    code = up.wait(timeout=60)
    assert code == 1, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "crashed" and summary["restarts"] == {}
    assert f"collector-1 (pid {pid}) exited with code -9" in summary["error"]
    assert "restarting" not in up.stderr
    up.assert_no_orphans()


def test_the_coordinator_comes_back_on_its_port_with_resume_after_its_back_off(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)  # the children run `python -m rlfleet` from here
    run_dir = tmp_path / "run"
    cluster = LocalCluster(_config(tmp_path), run_dir, str(run_dir / "storage"),
                           max_restarts=1)
    marker = uuid.uuid4().hex
    cluster.env[MARKER_VAR] = marker
    try:
        first = cluster.start_coordinator()
        _kill_group(first.proc.pid)
        first.proc.wait(10)
        now = time.monotonic()
        assert cluster.restart_crashed(now) == [], "restarted before its 0.5 s back-off"
        (restart,) = cluster.restart_crashed(now + 0.5)
        assert str(restart) == (f"coordinator (pid {first.proc.pid}) exited with code -9: "
                                "restarting (1/1)")
        again = restart.child
        assert cluster.coordinator is again and cluster.children == [again]
        assert again.port == first.port
        args = proc_cmdline(again.proc.pid).split()
        assert args[-1] == "--resume" and args[args.index("--port") + 1] == str(first.port)
        wait_for(lambda: requests.get(f"{again.url}/health", timeout=2).json()["ok"], 60,
                 "the restarted coordinator to answer on its old port")
        _kill_group(again.proc.pid)
        again.proc.wait(10)
        with pytest.raises(RestartsExhausted, match=f"pid {again.proc.pid}.* after 1 restarts"):
            cluster.restart_crashed(time.monotonic() + 60)
        assert cluster.restarts == {"coordinator": 1}
    finally:
        cluster.shutdown()
    assert cluster.restart_crashed() == [], "a cluster shutting down restarts nothing"
    wait_for(lambda: not marked_pids(marker), 15, "every process the cluster started to exit")
