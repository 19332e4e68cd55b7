"""Registration against a real coordinator and a real collector process.

A worker the coordinator forgot registers again and goes on working: no learner here (the
replay ratio is switched off so the collector keeps producing chunks on its own), and the
coordinator forgets the collector in the two ways that happen in practice: it is told the
worker left (`DELETE /workers/<id>`), and it restarts. Either way the next heartbeat gets 404
and the collector registers again under the same id, gets a new collect task and reports
chunks under it. And a task that reaches a worker before its registration finished waits.

One id is one process: a second learner started under the id of a learner that is alive
exits with the coordinator's refusal, and the first trains on undisturbed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import Processes, Service, free_port, small_config, wait_for

# Heartbeats every 0.2 s against a 5-s timeout: on a machine shared with another test a
# worker may be dropped that should not be. `make test` runs these on their own.
pytestmark = pytest.mark.alone


def _config(tmp: Path) -> Path:
    return small_config(
        tmp / "config.yaml",
        buffers={"replay": {"capacity": 2048, "rate_limit": {"samples_per_insert": None}}},
        eval={"every_env_steps": 10_000_000},
        stop={"max_env_steps": None, "max_wall_s": 120},
        coordinator={"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 5.0},
    )


def _start_coordinator(processes: Processes, config: Path, run_dir: Path,
                       port: int | None = None, *extra: str) -> Service:
    coordinator = processes.start("coordinator", "coordinator", "--config", str(config),
                                  "--run-dir", str(run_dir), "--name", "it-reregister",
                                  *extra, port=port)
    coordinator.wait_healthy()
    return coordinator


def _worker(coordinator: Service, worker_id: str) -> dict:
    return coordinator.get(f"{API}/workers/{worker_id}")


def _collect_tasks(coordinator: Service, worker_id: str) -> list[dict]:
    return [t for t in coordinator.get(f"{API}/tasks")["tasks"]
            if t["kind"] == "collect" and t["worker_id"] == worker_id]


def _running_task(coordinator: Service, collector: Service, worker_id: str,
                  not_id: str | None = None) -> str:
    """Waits until `worker_id` runs a collect task (other than `not_id`) and the collector
    itself reports it as its task; returns its id."""
    def running() -> str | None:
        tasks = [t for t in _collect_tasks(coordinator, worker_id)
                 if t["state"] == "running" and t["task_id"] != not_id]
        if len(tasks) == 1 and collector.get("/status")["task_id"] == tasks[0]["task_id"]:
            return tasks[0]["task_id"]
        return None

    return wait_for(running, 30, f"{worker_id} to run a new collect task")


def _chunks_accepted(coordinator: Service) -> int:
    return coordinator.get(f"{API}/status")["counters"]["chunks_accepted"]


def test_worker_registers_again_after_it_was_removed(processes: Processes, tmp_path: Path):
    coordinator = _start_coordinator(processes, _config(tmp_path), tmp_path / "run")
    collector = processes.start("collector", "collector", "--coordinator", coordinator.url,
                                "--worker-id", "c1")
    first = _running_task(coordinator, collector, "c1")
    wait_for(lambda: _chunks_accepted(coordinator) > 0, 30, "the first chunks")
    assert _worker(coordinator, "c1")["registrations"] == 1

    # An unknown worker's heartbeat is a 404 naming the field: what the agent reacts to.
    resp = requests.post(f"{coordinator.url}{API}/workers/nobody/heartbeat", json={},
                         timeout=5)
    assert resp.status_code == 404 and resp.json()["field"] == "worker_id"

    left = requests.delete(f"{coordinator.url}{API}/workers/c1", timeout=5)
    assert left.status_code == 200 and left.json()["state"] == "left"

    def registered_again() -> bool:
        w = _worker(coordinator, "c1")
        return w["registrations"] == 2 and w["state"] == "alive"

    wait_for(registered_again, 20, "c1 to register again after its heartbeat got 404")
    second = _running_task(coordinator, collector, "c1", not_id=first)
    assert second != first
    tasks = {t["task_id"]: t for t in _collect_tasks(coordinator, "c1")}
    assert tasks[first]["state"] == "finished"  # leaving ends the worker's tasks
    assert collector.get("/status")["error"] is None

    # Chunks keep flowing under the new task.
    before = _chunks_accepted(coordinator)
    wait_for(lambda: _chunks_accepted(coordinator) > before + 5, 30,
             "chunks reported under the new task")
    assert "registering again" in collector.tail(200)
    workers = coordinator.get(f"{API}/workers")["workers"]
    assert [w["worker_id"] for w in workers] == ["c1"], "the same worker, not a second one"


def test_worker_registers_again_after_the_coordinator_restarts(processes: Processes,
                                                               tmp_path: Path):
    config, run_dir = _config(tmp_path), tmp_path / "run"
    coordinator = _start_coordinator(processes, config, run_dir)
    collector = processes.start("collector", "collector", "--coordinator", coordinator.url,
                                "--worker-id", "c1")
    _running_task(coordinator, collector, "c1")
    wait_for(lambda: _chunks_accepted(coordinator) > 0, 30, "the first chunks")

    assert coordinator.stop() == 0
    processes.services.remove(coordinator)
    restarted = _start_coordinator(processes, config, run_dir, port=coordinator.port)
    # A fresh coordinator (no --resume) restores nothing: whatever it counts, the collector
    # reported to it (workers register again within 0.1 s, so it may count some already).
    assert "restored run" not in restarted.tail(200), "a fresh coordinator restores nothing"

    wait_for(lambda: _worker(restarted, "c1")["state"] == "alive", 30,
             "c1 to register with the restarted coordinator")
    _running_task(restarted, collector, "c1")
    wait_for(lambda: _chunks_accepted(restarted) > 5, 30,
             "chunks reported to the restarted coordinator")
    assert collector.get("/status")["error"] is None
    assert collector.proc.poll() is None


def test_a_collector_goes_on_with_a_coordinator_that_resumed(processes: Processes,
                                                            tmp_path: Path):
    """Restarted with `--resume`, the coordinator continues from the snapshot it saved on
    SIGTERM: the collector registers again and carries on, and by the end of the run no chunk
    was lost or counted twice, and storage holds exactly the chunks the buffer refers to."""
    max_env_steps = 12_000  # past the 2,048-item capacity: evictions and deletions too
    config = small_config(
        tmp_path / "config.yaml",
        buffers={"replay": {"capacity": 2048, "rate_limit": {"samples_per_insert": None}}},
        eval={"every_env_steps": 10_000_000},
        stop={"max_env_steps": max_env_steps, "max_wall_s": 120},
        # released chunks are deleted once a snapshot no longer refers to them
        coordinator={"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 5.0,
                     "snapshot_interval_s": 2.0},
    )
    run_dir = tmp_path / "run"
    first = _start_coordinator(processes, config, run_dir)
    collector = processes.start("collector", "collector", "--coordinator", first.url,
                                "--worker-id", "c1")
    _running_task(first, collector, "c1")
    wait_for(lambda: _chunks_accepted(first) > 5, 30, "the first chunks")

    assert first.stop() == 0
    processes.services.remove(first)
    resumed = _start_coordinator(processes, config, run_dir, first.port, "--resume")
    status = resumed.get(f"{API}/status")
    restored = status["counters"]["chunks_accepted"]
    assert restored > 5, "the resumed coordinator starts from the snapshot, not from zero"
    assert status["counters"]["env_steps"] == restored * 128
    assert status["buffers"]["replay"]["inserted_chunks"] == restored
    assert status["run"]["state"] == "running" or restored * 128 >= max_env_steps

    wait_for(lambda: resumed.get(f"{API}/status")["run"]["state"] == "stopped", 90,
             f"the resumed run to stop at max_env_steps={max_env_steps}")
    storage = DirectoryStorage(run_dir / "storage")

    def quiet() -> bool:
        c = collector.get("/status")
        s = resumed.get(f"{API}/status")
        seen = (f"collector wrote {c['chunks_written']}, reported {c['chunks_reported']}; "
                f"coordinator accepted {s['counters']['chunks_accepted']}, holds "
                f"{s['buffer']['chunks']}; storage holds {len(storage.list_chunks())}")
        assert c["chunks_reported"] == c["chunks_written"] == \
            s["counters"]["chunks_accepted"], seen
        assert len(storage.list_chunks()) == s["buffer"]["chunks"], seen
        return True

    wait_for(quiet, 30, "every chunk reported and every released chunk deleted")
    s = resumed.get(f"{API}/status")
    assert s["counters"]["chunks_accepted"] > restored
    assert s["counters"]["env_steps"] == s["counters"]["chunks_accepted"] * 128
    assert s["buffers"]["replay"]["inserted_chunks"] == s["counters"]["chunks_accepted"]
    assert s["buffer"] == {"size": 2048, "chunks": 2048 // 128}
    assert collector.get("/status")["error"] is None
    assert _worker(resumed, "c1")["registrations"] == 1  # registered with it once


def test_a_task_that_arrives_before_the_registration_answer_waits_for_it(
        processes: Processes, tmp_path: Path):
    """The coordinator pushes a worker's task from another thread as soon as it registers
    it, so the task can reach the worker before the worker has read the registration's
    answer (which carries the run's config). Made deterministic here: the task is pushed
    while no coordinator is up yet; the worker must wait for its config, not crash."""
    port = free_port()
    collector = processes.start("collector", "collector", "--coordinator",
                                f"http://127.0.0.1:{port}", "--worker-id", "c1")
    collector.wait_healthy()
    task = {"task": {"kind": "collect", "task_id": "collect-early", "seed": 1}}
    resp = requests.post(f"{collector.url}/task", json=task, timeout=5)
    assert resp.status_code == 200 and resp.json()["accepted"] is True
    status = collector.get("/status")
    assert status["registered"] is False and status["error"] is None

    coordinator = _start_coordinator(processes, _config(tmp_path), tmp_path / "run",
                                     port=port)
    _running_task(coordinator, collector, "c1")
    wait_for(lambda: _chunks_accepted(coordinator) > 0, 30, "chunks from the collector")
    assert collector.get("/status")["error"] is None


def test_a_second_learner_under_a_live_learners_id_exits_and_the_first_trains_on(
        processes: Processes, tmp_path: Path):
    config = small_config(
        tmp_path / "config.yaml", eval={"every_env_steps": 10_000_000},
        stop={"max_env_steps": None, "max_wall_s": 150},
        coordinator={"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 5.0})
    coordinator = _start_coordinator(processes, config, tmp_path / "run")
    processes.start("collector", "collector", "--coordinator", coordinator.url,
                    "--worker-id", "c1")
    first = processes.start("learner", "learner", "--coordinator", coordinator.url,
                            "--worker-id", "l1")

    def iterations() -> int:
        return coordinator.get(f"{API}/status")["counters"]["train_iterations"]

    wait_for(lambda: iterations() > 0, 90, "the first learner training")
    group = coordinator.get(f"{API}/status")["learner_group"]
    twin = processes.start("twin", "learner", "--coordinator", coordinator.url,
                           "--worker-id", "l1")
    code = twin.proc.wait(timeout=90)
    said = twin.tail(60)
    assert code != 0, said
    assert "409" in said and "worker_id='l1'" in said and first.url in said, said

    # the run did not notice: l1 is the first process, registered once, in the same group
    w = _worker(coordinator, "l1")
    assert (w["url"], w["registrations"], w["state"]) == (first.url, 1, "alive")
    now = coordinator.get(f"{API}/status")["learner_group"]
    assert (now["generation"], now["reformations"]) == (group["generation"],
                                                        group["reformations"])
    before = iterations()
    wait_for(lambda: iterations() > before + 50, 60, "the first learner training on")
    assert first.proc.poll() is None and first.get("/status")["error"] is None
    assert "refused" in coordinator.tail(400)
