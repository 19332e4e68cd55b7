"""A run on a real Slurm cluster (`cluster.py`: slurmctld and three slurmd nodes, each on a
network namespace of its own, with munge), submitted with `rlfleet slurm submit` from the
controller's host as from a login node: the coordinator (with the Redis its job starts for
the run's storage, `--redis`) and the learner in partition `learn` (node n1), the collectors
in partition `collect` (n2 and n3, least-loaded first).

One run goes through everything in turn: it trains; `rlfleet scale` takes it from 2 to 4
collectors and back (the drained collectors' chunks all reported); the node of a collector
dies (its slurmd and every process on it killed, its link down) and its collector job is
requeued onto the other; the learner's job is requeued as a preemption requeues it (it
checkpoints on SIGTERM and resumes from that checkpoint); a collector gets the warning Slurm
sends before a time limit (SIGUSR1) and requeues itself; the coordinator's job is requeued
(it resumes from its snapshot at a new address, and the worker jobs are requeued to find
it); then the run solves CartPole and every job ends. Every role is where Slurm put it (the
coordinator's `/api/v1/workers` against Slurm's own record), the ledger balances on every
status answer, and nothing is left behind.

Collection is paused (`POST /api/v1/run/pause`) around the faults and the scaling, so the run
cannot solve (and end) half-way through them; the first evaluation is due at 30,000 env steps.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import requests
import yaml
from chaos.harness import Monitor
from integration.helpers import REPO, wait_for

from rlfleet.shared.contract.wire.base import API
from rlfleet.slurm import rendezvous

from .cluster import SlurmCluster, unavailable

UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"slurm: {UNAVAILABLE}")

KILL_WAIT_S = 5
PARTITIONS = {"learn": "Nodes=n1 Default=YES MaxTime=INFINITE State=UP",
              "collect": "Nodes=n2,n3 MaxTime=INFINITE State=UP LLN=YES"}


class Run:
    """The coordinator as the test reaches it: from the controller's host (the test's own
    namespace has no route to the cluster), at the address the run directory names."""

    def __init__(self, cluster: SlurmCluster, run_dir: Path) -> None:
        self.cluster = cluster
        self.run_dir = run_dir

    @property
    def url(self) -> str:
        rv = rendezvous.read(self.run_dir)
        if rv is None:
            raise requests.ConnectionError("no coordinator address yet")
        return rv.url

    def _call(self, method: str, path: str) -> dict:
        with self.cluster.ctl.inside():
            r = requests.request(method, f"{self.url}{API}{path}", timeout=5)
        r.raise_for_status()
        return r.json()

    def get(self, path: str) -> dict:
        return self._call("GET", path)

    def post(self, path: str) -> dict:
        return self._call("POST", path)

    def status(self) -> dict:
        return self.get("/status")

    def workers(self, role: str, state: str = "alive") -> list[dict]:
        try:
            listed = self.get("/workers")["workers"]
        except (requests.RequestException, ValueError):
            return []
        return [w for w in listed if w["role"] == role and w["state"] == state]

    def rlfleet(self, *argv: str) -> str:
        done = self.cluster.run(sys.executable, "-m", "rlfleet", *argv, check=False,
                                timeout=120)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    def log(self, role: str, job_id: str) -> str:
        path = self.run_dir / "slurm" / "logs" / f"{role}-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""


def where_slurm_put_it(cluster: SlurmCluster, worker: dict) -> None:
    """The worker reports the job and node Slurm gave it, and serves on that node's address."""
    slurm = worker["resources"]["slurm"]
    job = cluster.job(int(slurm["job_id"]))
    assert job is not None and job["NodeList"] == slurm["node"], (worker, job)
    assert worker["url"].startswith(f"http://{cluster.host(slurm['node']).ip}:"), worker


def test_a_run_on_slurm_scales_survives_a_dead_node_and_a_preemption_and_solves(
        tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # `rlfleet status`'s table, unwrapped
    # 5 s from SIGTERM to SIGKILL: a collector drains and a learner checkpoints in about one
    cluster = SlurmCluster(tmp_path / "cluster", partitions=PARTITIONS,
                           conf={"KillWait": KILL_WAIT_S})
    monitor = None
    try:
        cluster.start()
        data = yaml.safe_load((REPO / "configs" / "cartpole-dqn.yaml").read_text())
        data["eval"].update(start_env_steps=30_000, every_env_steps=5_000)
        data["stop"] = {"max_wall_s": 600}
        config = tmp_path / "cartpole.yaml"
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        run_dir = tmp_path / "run"
        run = Run(cluster, run_dir)
        out = run.rlfleet("slurm", "submit", "--config", str(config), "--run-dir",
                          str(run_dir), "--collectors", "2", "--partition", "learn",
                          "--collector-partition", "collect", "--learner-cpus", "2",
                          "--redis")
        assert "submitted the coordinator's job" in out

        # -- it trains, every role where Slurm put it -------------------------------------------
        wait_for(lambda: len(run.workers("collector")) == 2 and run.workers("learner"), 90,
                 "a learner and 2 collectors to register")
        monitor = Monitor(run).start()
        wait_for(lambda: run.status()["counters"]["train_iterations"] > 50, 90,
                 "the learner to train")
        run.post("/run/pause")
        rv = rendezvous.read(run_dir)
        coordinator = cluster.job(int(rv.job_id))
        assert coordinator["NodeList"] == rv.node == "n1"
        assert rv.url.startswith(f"http://{cluster.host('n1').ip}:")
        learner = run.workers("learner")[0]
        where_slurm_put_it(cluster, learner)
        assert learner["resources"]["slurm"]["node"] == "n1"
        for w in run.workers("collector"):
            where_slurm_put_it(cluster, w)
            assert w["resources"]["slurm"]["node"] in ("n2", "n3")
        table = run.rlfleet("status", "--run-dir", str(run_dir))
        assert f"job {learner['resources']['slurm']['job_id']} on n1" in table, table
        assert f"coordinator: job {rv.job_id} on n1" in table, table
        assert run.status()["run"]["storage"].startswith(f"redis://{cluster.host('n1').ip}:")

        # -- 2 -> 4 -> 2 collectors -------------------------------------------------------------
        assert "collectors wanted: 4" in run.rlfleet("scale", "--run-dir", str(run_dir),
                                                     "--collectors", "4")
        wait_for(lambda: len(run.workers("collector")) == 4, 90, "4 collectors")
        run.post("/run/resume")  # each of the four collects
        wait_for(lambda: all(w["status"].get("env_steps", 0) > 0
                             for w in run.workers("collector")), 60, "all 4 to collect")
        run.post("/run/pause")
        for w in run.workers("collector"):
            where_slurm_put_it(cluster, w)
        assert {w["resources"]["slurm"]["node"] for w in run.workers("collector")} == \
            {"n2", "n3"}  # least loaded first: spread over both
        run.rlfleet("scale", "--run-dir", str(run_dir), "--collectors", "2")
        wait_for(lambda: len(run.workers("collector", "left")) == 2, 60,
                 "2 collectors to drain and leave")
        for w in run.workers("collector", "left"):
            job_id = w["resources"]["slurm"]["job_id"]
            found = re.search(r"drained: (\d+) chunks written, (\d+) reported",
                              run.log("collector", job_id))
            assert found, run.log("collector", job_id)[-2000:]
            written, reported = map(int, found.groups())
            assert written == reported == w["chunks_accepted"] > 0, w
        wait_for(lambda: len([j for j in cluster.jobs() if j["name"].endswith("-collector")
                              and j["state"] in ("RUNNING", "PENDING")]) == 2, 30,
                 "the 2 cancelled collector jobs to end")

        # -- a collector's node dies -------------------------------------------------------------
        victim = run.workers("collector")[0]
        node = victim["resources"]["slurm"]["node"]
        job_id = victim["resources"]["slurm"]["job_id"]
        cluster.kill_node(node)
        cluster.wait_nodes([node], ("DOWN",), 30)

        def requeued_elsewhere() -> bool:
            back = [w for w in run.workers("collector")
                    if w["resources"]["slurm"]["job_id"] == job_id
                    and w["resources"]["slurm"]["restart_count"] >= 1]
            return bool(back) and back[0]["resources"]["slurm"]["node"] != node

        wait_for(requeued_elsewhere, 90, f"collector job {job_id} to run again off {node}")
        wait_for(lambda: len(run.workers("collector")) == 2, 60, "2 collectors again")
        for w in run.workers("collector"):
            where_slurm_put_it(cluster, w)

        # -- the learner is preempted: requeued -------------------------------------------------
        learner_job = learner["resources"]["slurm"]["job_id"]
        cluster.run("scontrol", "requeue", learner_job)

        def learner_back() -> bool:
            back = run.workers("learner")
            return bool(back) and back[0]["resources"]["slurm"]["restart_count"] >= 1

        wait_for(learner_back, 90, "the requeued learner to register again")
        resumed = wait_for(lambda: re.search(r"resumed from checkpoint at train iteration "
                                             r"(\d+)", run.log("learner", learner_job)),
                           30, "the learner to resume from its checkpoint")
        assert int(resumed.group(1)) > 0
        assert "exited with code" not in run.log("learner", learner_job)  # its data process

        # -- a collector is warned of its time limit (SIGUSR1): it leaves and requeues itself --
        warned = run.workers("collector")[0]["resources"]["slurm"]
        cluster.run("scancel", "--batch", "--signal=USR1", warned["job_id"])

        def warned_back() -> bool:
            return any(w["resources"]["slurm"]["job_id"] == warned["job_id"]
                       and w["resources"]["slurm"]["restart_count"] > warned["restart_count"]
                       for w in run.workers("collector"))

        wait_for(warned_back, 60, f"collector job {warned['job_id']} to requeue itself")
        assert "Slurm's warning (SIGUSR1)" in run.log("collector", warned["job_id"])

        # -- the coordinator is preempted: it comes back at a new port, the workers follow ----
        before = rendezvous.read(run_dir)
        acknowledged = run.status()["ledger"]["acknowledged"]
        cluster.run("scontrol", "requeue", before.job_id)
        moved = wait_for(lambda: (rv := rendezvous.read(run_dir)) and rv.url != before.url
                         and rv.restart_count >= 1 and rv, 60, "the coordinator to come back")
        assert moved.job_id == before.job_id
        wait_for(lambda: len(run.workers("collector")) == 2 and run.workers("learner"), 90,
                 "every worker to find the coordinator again")
        assert run.status()["ledger"]["acknowledged"] >= acknowledged

        # -- it solves, and every job ends -----------------------------------------------------
        run.post("/run/resume")
        wait_for(lambda: (run_dir / "summary.json").exists(), 300, "the run to end")
        wait_for(lambda: not [j for j in cluster.jobs()
                              if j["state"] in ("RUNNING", "PENDING", "COMPLETING")],
                 60, "every job of the run to end")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["solved"] is True, summary
        assert summary["first_chunk_s_from_submit"] is not None
        monitor.stop.set()
        assert monitor.answers > 20 and not monitor.violations, monitor.violations
    finally:
        if monitor is not None:
            monitor.stop.set()
        killed_hard = cluster.close()
    assert killed_hard == []
    assert cluster.leftovers() == []
