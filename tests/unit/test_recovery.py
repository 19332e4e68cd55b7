"""Crash survival, one recovery path at a time, against real coordinator processes over HTTP:
the ledger, the write-ahead journal across a SIGKILL, garbage collection of chunks nobody
announced, tasks of dead workers handed on, a dead learner's queue chunks requeued, and a
storage outage answered with 503 that changes nothing. Every wait has a deadline."""

from __future__ import annotations

import os
import signal
import threading
import uuid

import numpy as np
import pytest
import redis

from rlfleet.collector.adder import StorageAdder
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import (
    REDIS_URL,
    CoordinatorPool,
    CoordinatorProc,
    buffer_config,
    collector_and_learner,
    get,
    kill_tree,
    make_config,
    ok,
    post,
    register,
    report,
    wait_for,
    write_chunk,
)

FREE = {"min_size": 1}
SMALL = {"buffers": {"replay": buffer_config(capacity=64, rate_limit=FREE)}}
QUEUE = {"buffers": {"rollouts": buffer_config(kind="queue", capacity=100_000,
                                               rate_limit=FREE, max_policy_lag=2)},
         "learner": {"mix": [{"buffer": "rollouts", "fraction": 1.0}]},
         "algo": {"name": "ppo", "max_policy_lag": 100}}
FAST_REAP = {"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 0.6,
             "task_push_timeout_s": 2.0, "snapshot_interval_s": 0.3}


def balanced(c: CoordinatorProc) -> dict:
    ledger = c.status()["ledger"]
    assert ledger["balanced"], ledger
    assert set(ledger["duplicate_chunks"].values()) == {0}, ledger
    return ledger


def sigkill(c: CoordinatorProc) -> None:
    kill_tree(c.proc)


def restart(pool: CoordinatorPool, c: CoordinatorProc, **config) -> CoordinatorProc:
    """A coordinator on the same storage, with `--resume`, as a supervisor would start it."""
    cfg = {**c.config, **config}
    return pool.start(cfg, c.storage_dir, "--resume")


def buffer_ids(c: CoordinatorProc, name: str) -> list[str]:
    return get(c, f"/buffers/{name}/chunks")["chunk_ids"]


# -- the ledger ------------------------------------------------------------------------------

def _take(c: CoordinatorProc, learner: str, buffer: str) -> list[str]:
    got = post(c, "/sample", {"worker_id": learner, "batch_size": 1, "num_batches": 8,
                              "wait_s": 0, "by_buffer": {buffer: 1}})
    return got.json()["chunk_ids"] if got.status_code == 200 else []


def _learn_info(c: CoordinatorProc, learner: str, version: int, consumed=None) -> None:
    ok(post(c, "/learn-info", {"worker_id": learner, "train_iterations": version,
                               "policy_version": version, "consumed": consumed or []}))


def test_the_ledger_counts_every_release_by_reason(coordinator, task_sink):
    c = coordinator(buffers={"q": buffer_config(kind="queue", capacity=64, rate_limit=FREE,
                                                max_policy_lag=1)},
                    learner={"mix": [{"buffer": "q", "fraction": 1.0}]},
                    algo={"name": "ppo"})
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    for v in (0, 0, 0, 3, 3):  # 16 rows each: the fifth overflows the oldest
        ok(report(c, col["worker_id"], collect["task_id"], [(uuid.uuid4().hex, 16)],
                  policy_version=v))
        balanced(c)
    assert balanced(c)["dropped"] == {"overflow": 1}
    _learn_info(c, lrn["worker_id"], 3)
    taken = _take(c, lrn["worker_id"], "q")  # the two at version 0 are too old
    assert len(taken) == 2
    ledger = balanced(c)
    assert ledger["dropped"] == {"overflow": 1, "policy_lag": 2}
    assert ledger["in_buffers"] == 2  # in flight still counts as held
    _learn_info(c, lrn["worker_id"], 4, [{"buffer": "q", "chunk_ids": taken}])
    ledger = balanced(c)
    assert (ledger["acknowledged"], ledger["in_buffers"], ledger["consumed"],
            ledger["evicted"]) == (5, 0, 2, 0)


def test_a_chunk_in_two_buffers_is_counted_once_when_the_last_lets_go(coordinator,
                                                                      task_sink):
    c = coordinator(buffers={"small": buffer_config(capacity=16, rate_limit=FREE),
                             "q": buffer_config(kind="queue", capacity=1000,
                                                rate_limit=FREE)},
                    learner={"mix": [{"buffer": "small", "fraction": 1.0}]})
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    ok(report(c, col["worker_id"], collect["task_id"], [(first, 16)]))
    ok(report(c, col["worker_id"], collect["task_id"], [(second, 16)]))
    ledger = balanced(c)  # "small" evicted the first, but the queue still holds it
    assert (ledger["in_buffers"], ledger["evicted"]) == (2, 0)
    taken = _take(c, lrn["worker_id"], "q")
    assert taken == [first, second]
    _learn_info(c, lrn["worker_id"], 1, [{"buffer": "q", "chunk_ids": taken}])
    ledger = balanced(c)  # the first went with the queue's consume, the second stays
    assert (ledger["in_buffers"], ledger["consumed"], ledger["evicted"]) == (1, 1, 0)
    assert buffer_ids(c, "small") == [second] and buffer_ids(c, "q") == []


def test_the_ledger_balances_at_every_moment_under_load(coordinator, task_sink):
    c = coordinator(**SMALL)
    col, collect, _, _ = collector_and_learner(c, task_sink)
    stop = threading.Event()
    sent = []

    def collect_loop() -> None:
        while not stop.is_set():
            cid = uuid.uuid4().hex
            resp = report(c, col["worker_id"], collect["task_id"], [(cid, 16)])
            assert resp.status_code == 200, resp.text
            sent.append(cid)

    threads = [threading.Thread(target=collect_loop) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(60):
            balanced(c)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    ledger = balanced(c)
    assert ledger["acknowledged"] == len(sent) and ledger["evicted"] > 0


# -- the write-ahead journal across a SIGKILL ---------------------------------------------------

@pytest.mark.parametrize("backend,snapshot_every", [
    ("directory", 3600.0), ("directory", 0.3), ("redis", 3600.0), ("redis", 0.3)])
def test_a_killed_coordinator_loses_no_acknowledged_chunk(coordinator_pool, task_sink,
                                                          tmp_path, backend, snapshot_every):
    """With no snapshot since the reports (3600 s) everything comes from the journal; with
    frequent ones, from a snapshot plus the journal after it."""
    cfg = make_config(**SMALL, coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0,
                                            "snapshot_interval_s": snapshot_every})
    cfg["name"] = f"wal-{uuid.uuid4().hex[:12]}"
    storage = REDIS_URL if backend == "redis" else tmp_path / "storage"
    c = coordinator_pool.start(cfg, storage)
    try:
        col, collect, _, _ = collector_and_learner(c, task_sink)
        acked = []
        for i in range(12):
            cid = uuid.uuid4().hex
            ok(report(c, col["worker_id"], collect["task_id"], [(cid, 16)],
                      episode_returns=[float(i)], episode_lengths=[16]))
            acked.append(cid)
        before = c.status()
        held = set(buffer_ids(c, "replay"))
        sigkill(c)

        c2 = coordinator_pool.start(cfg, storage, "--resume")
        after = c2.status()
        for key in ("env_steps", "chunks_accepted", "episodes"):
            assert after["counters"][key] == before["counters"][key], key
        assert after["counters"]["chunks_accepted"] == 12
        ledger = balanced(c2)
        assert ledger["acknowledged"] == 12
        assert set(buffer_ids(c2, "replay")) == held  # the same chunks, each once
        assert ledger["in_buffers"] == len(held) and ledger["evicted"] == 12 - len(held)
        # the collector's retry of an acknowledged report counts nothing twice
        register(c2, "collector", task_sink(), col["worker_id"])
        resp = ok(report(c2, col["worker_id"], collect["task_id"], [(acked[-1], 16)]))
        assert resp["accepted"] == 0
        assert c2.status()["counters"]["chunks_accepted"] == 12
    finally:
        if backend == "redis":
            _wipe_redis(cfg["name"])


def _wipe_redis(name: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"rlfleet:{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


# -- garbage collection ------------------------------------------------------------------------

GC = {"gc_interval_s": 0.2, "orphan_grace_s": 0.6}


def test_chunks_written_but_never_announced_are_collected(coordinator, task_sink):
    c = coordinator(coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0, **GC})
    col, collect, _, _ = collector_and_learner(c, task_sink)
    storage = DirectoryStorage(c.storage_dir)
    orphan = write_chunk(c, 8)  # its collector "died" before announcing it
    kept = write_chunk(c, 8)
    ok(report(c, col["worker_id"], collect["task_id"], [(kept, 8)]))
    wait_for(lambda: orphan not in storage.list_chunks(), timeout_s=15,
             what="the unannounced chunk deleted")
    assert kept in storage.list_chunks()
    ledger = balanced(c)
    assert ledger["orphans_deleted"] == 1 and ledger["acknowledged"] == 1
    # announced too late: its bytes are gone, so it is refused, never acknowledged
    assert ok(report(c, col["worker_id"], collect["task_id"], [(orphan, 8)]))["accepted"] == 0
    assert balanced(c)["acknowledged"] == 1


def test_deletions_cut_short_by_a_crash_happen_after_restart(coordinator_pool, task_sink,
                                                               tmp_path):
    """Evicted chunks wait for a snapshot before deletion; a crash before it leaves them in
    storage. The restart's journal replay evicts them again, and its first snapshot lets
    them be deleted: nothing leaks, nothing held is deleted."""
    cfg = make_config(**SMALL, coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0,
                                            "snapshot_interval_s": 3600.0, **GC})
    c = coordinator_pool.start(cfg, tmp_path / "storage")
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ids = [write_chunk(c, 16) for _ in range(10)]
    for cid in ids:
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 16)]))
    storage = DirectoryStorage(tmp_path / "storage")
    held = set(buffer_ids(c, "replay"))
    assert len(held) == 4 and set(storage.list_chunks()) == set(ids)
    sigkill(c)
    cfg["coordinator"]["snapshot_interval_s"] = 0.3
    c2 = coordinator_pool.start(cfg, tmp_path / "storage", "--resume")
    assert set(buffer_ids(c2, "replay")) == held
    wait_for(lambda: set(storage.list_chunks()) == held, timeout_s=15,
             what="evicted chunks deleted after the restart's first snapshot")
    ledger = balanced(c2)
    assert (ledger["acknowledged"], ledger["evicted"], ledger["orphans_deleted"]) == (10, 6, 0)


# -- dead workers' work ---------------------------------------------------------------------------

class Heartbeats:
    """A worker's heartbeat loop, as a thread that can be stopped (the worker "dies")."""

    def __init__(self, c: CoordinatorProc, worker_id: str) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(c, worker_id), daemon=True)
        self.thread.start()

    def _run(self, c: CoordinatorProc, worker_id: str) -> None:
        while not self.stop.wait(0.1):
            post(c, f"/workers/{worker_id}/heartbeat", {"status": {}})

    def kill(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def task(c: CoordinatorProc, task_id: str) -> dict:
    return get(c, f"/tasks/{task_id}")


def test_a_dead_collectors_task_goes_to_the_next_collector(coordinator, task_sink):
    c = coordinator(coordinator=FAST_REAP)
    sink_a = task_sink()
    a = register(c, "collector", sink_a)
    first = sink_a.wait_task("collect")
    wait_for(lambda: task(c, first["task_id"])["state"] == "unassigned", timeout_s=10,
             what="the dead collector's task unassigned")
    workers = {w["worker_id"]: w for w in c.status()["workers"]}
    assert workers[a["worker_id"]]["state"] == "dead"
    sink_b = task_sink()
    register(c, "collector", sink_b)
    second = sink_b.wait_task("collect")
    assert second["task_id"] == first["task_id"]
    assert second["seed"] != first["seed"]  # the new collector does not replay its episodes
    info = task(c, first["task_id"])
    assert info["reassignments"] == 1 and info["state"] in ("pending", "running")


def test_a_dead_collectors_evaluation_moves_to_a_live_one(coordinator, task_sink):
    c = coordinator(coordinator={**FAST_REAP, "heartbeat_timeout_s": 1.0},
                    eval={"every_env_steps": 32})
    sinks = [task_sink(), task_sink()]
    ids = [register(c, "collector", s, f"c{i}")["worker_id"] for i, s in enumerate(sinks)]
    beats = {wid: Heartbeats(c, wid) for wid in ids}
    tasks = [s.wait_task("collect") for s in sinks]
    for t in tasks:
        wait_for(lambda t=t: task(c, t["task_id"])["state"] == "running", what="running")
    lrn = register(c, "learner", task_sink())
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 1,
                               "policy_version": 0}))
    ok(report(c, ids[0], tasks[0]["task_id"], [(uuid.uuid4().hex, 64)]))
    ev = wait_for(lambda: [s for s in sinks if s.tasks("evaluate")], timeout_s=10,
                  what="an evaluation pushed")[0].wait_task("evaluate")
    holder = next(i for i, s in enumerate(sinks) if s.tasks("evaluate"))
    other = 1 - holder
    beats[ids[holder]].kill()
    moved = sinks[other].wait_task("evaluate", timeout_s=10)
    assert moved["task_id"] == ev["task_id"]
    assert task(c, ev["task_id"])["worker_id"] == ids[other]
    for b in beats.values():
        b.kill()


def test_a_dead_learners_queue_chunks_go_back_to_the_queue(coordinator, task_sink):
    c = coordinator(**QUEUE, coordinator=FAST_REAP)
    col, collect, lrn, learn = collector_and_learner(c, task_sink)
    beats = Heartbeats(c, col["worker_id"])
    ids = [uuid.uuid4().hex for _ in range(3)]
    ok(report(c, col["worker_id"], collect["task_id"], [(cid, 16) for cid in ids]))
    got = ok(post(c, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 1,
                                 "num_batches": 2, "wait_s": 0,
                                 "mix": [{"buffer": "rollouts", "fraction": 1.0}]}))
    assert got["chunk_ids"] == ids[:2]
    stats = get(c, "/buffers/rollouts")
    assert stats["in_flight_chunks"] == 2
    # the learner stops heartbeating: it dies with two chunks in flight
    wait_for(lambda: get(c, "/buffers/rollouts")["queued_chunks"] == 3, timeout_s=10,
             what="in-flight chunks requeued")
    assert task(c, learn["task_id"])["state"] == "unassigned"
    new_sink = task_sink()
    new = register(c, "learner", new_sink)
    assert new_sink.wait_task("learn")["task_id"] == learn["task_id"]
    again = ok(post(c, "/sample", {"worker_id": new["worker_id"], "batch_size": 1,
                                   "num_batches": 3, "wait_s": 0,
                                   "mix": [{"buffer": "rollouts", "fraction": 1.0}]}))
    assert again["chunk_ids"] == ids  # the requeued ones first, in their order
    balanced(c)
    beats.kill()


def test_a_restarted_coordinator_gives_workers_their_tasks_back(coordinator_pool, task_sink,
                                                                 tmp_path):
    cfg = make_config(coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0})
    c = coordinator_pool.start(cfg, tmp_path / "storage")
    col, collect, lrn, learn = collector_and_learner(c, task_sink)
    ok(report(c, col["worker_id"], collect["task_id"], [(uuid.uuid4().hex, 16)]))
    sigkill(c)
    c2 = coordinator_pool.start(cfg, tmp_path / "storage", "--resume")
    # an unknown worker is told so (404): that is its cue to register again
    resp = post(c2, f"/workers/{col['worker_id']}/heartbeat", {"status": {}})
    assert resp.status_code == 404 and resp.json()["field"] == "worker_id"
    sinks = {"collector": task_sink(), "learner": task_sink()}
    register(c2, "collector", sinks["collector"], col["worker_id"])
    register(c2, "learner", sinks["learner"], lrn["worker_id"])
    assert sinks["collector"].wait_task("collect")["task_id"] == collect["task_id"]
    assert sinks["learner"].wait_task("learn")["task_id"] == learn["task_id"]
    resp = ok(report(c2, col["worker_id"], collect["task_id"], [(uuid.uuid4().hex, 16)]))
    assert resp["accepted"] == 1
    assert balanced(c2)["acknowledged"] == 2
    # new tasks never reuse a restored id
    other = task_sink()
    register(c2, "collector", other)
    assert other.wait_task("collect")["task_id"] not in (collect["task_id"],
                                                         learn["task_id"])


def test_a_restarted_coordinator_keeps_the_collectors_wished_for(coordinator_pool, tmp_path):
    """The launcher and the compose scaler follow the wish: a coordinator that came back
    without it would leave them holding whatever they had."""
    cfg = make_config(coordinator=FAST_REAP)
    c = coordinator_pool.start(cfg, tmp_path / "storage")
    assert ok(post(c, "/scale", {"collectors": 3}))["collectors_desired"] == 3
    # The generation steps when a snapshot starts; two steps: one was written whole.
    generation = c.status()["ledger"]["journal_generation"]
    wait_for(lambda: c.status()["ledger"]["journal_generation"] > generation + 1, 10,
             what="a snapshot after the wish")
    sigkill(c)
    c2 = coordinator_pool.start(cfg, tmp_path / "storage", "--resume")
    assert c2.status()["run"]["collectors_desired"] == 3


# -- a coordinator outage seen from a collector ---------------------------------------------

def test_a_collector_pauses_while_the_coordinator_cannot_acknowledge(coordinator, task_sink,
                                                                     tmp_path):
    """A stopped (hung) coordinator: the adder writes `max_held_chunks` chunks, then waits
    instead of piling up work the learner never asked for; once the coordinator answers,
    everything is acknowledged and collection goes on."""
    c = coordinator(coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0})
    sink = task_sink()
    worker_id = register(c, "collector", sink)["worker_id"]
    task_id = sink.wait_task("collect")["task_id"]
    wait_for(lambda: task(c, task_id)["state"] == "running", what="running")
    adder = StorageAdder(DirectoryStorage(tmp_path / "s"), HttpClient(c.url, timeout_s=1,
                                                                     retries=0),
                         lambda: worker_id, lambda: task_id, report_interval_s=0.02,
                         max_held_chunks=3)
    added: list[str] = []

    def collect() -> None:
        for i in range(5):
            added.append(adder.add(_rows(8), -1, [float(i)], [8]))

    os.kill(c.proc.pid, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=collect, daemon=True)
        thread.start()
        wait_for(lambda: len(added) == 3 and adder.chunks_written == 3, timeout_s=10,
                 what="three chunks written, none acknowledged")
        wait_for(lambda: adder.chunks_reported == 0 and thread.is_alive(), timeout_s=2,
                 what="add() waiting")
        assert len(added) == 3
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)
    thread.join(timeout=20)
    assert not thread.is_alive()
    wait_for(lambda: adder.chunks_reported == 5, timeout_s=20, what="all five acknowledged")
    assert adder.close(timeout=5)
    assert balanced(c)["acknowledged"] == 5


def _rows(n: int) -> dict:
    return {"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int64),
            "reward": np.ones(n, np.float32), "next_obs": np.zeros((n, 4), np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def test_chunks_dropped_unused_do_not_hold_collectors_back_for_ever(coordinator, task_sink):
    """A flood of chunks (collectors that went on while the coordinator was down) overflows
    a queue; the dropped rows will never be sampled, so the rate limiter balances samples
    against the rows kept, and collectors may go on once the learner took those."""
    c = coordinator(buffers={"q": buffer_config(kind="queue", capacity=1024, rate_limit={
                        "min_size": 256, "samples_per_insert": 1, "error_buffer": 512})},
                    learner={"mix": [{"buffer": "q", "fraction": 1.0}]},
                    algo={"name": "ppo"})
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    resp = ok(report(c, col["worker_id"], collect["task_id"],
                     [(uuid.uuid4().hex, 256) for _ in range(10)]))
    assert resp["throttle_s"] > 0  # the learner has taken nothing yet
    assert balanced(c)["dropped"] == {"overflow": 6}
    taken = _take(c, lrn["worker_id"], "q")
    assert len(taken) == 4
    permit = ok(post(c, "/permits/collect", {"worker_id": col["worker_id"], "wait_s": 0}))
    assert permit["granted"], "inserts stay blocked by rows that were dropped"


# -- storage outage -----------------------------------------------------------------------------

def test_a_report_during_a_storage_outage_gets_503_and_changes_nothing(coordinator_pool,
                                                                       task_sink, redis_server):
    cfg = make_config(coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0})
    c = coordinator_pool.start(cfg, redis_server.url, environ={"RLFLEET_STORAGE_RETRY_S": "0.5"})
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ok(report(c, col["worker_id"], collect["task_id"], [(uuid.uuid4().hex, 16)]))
    redis_server.kill()
    lost = uuid.uuid4().hex
    resp = report(c, col["worker_id"], collect["task_id"], [(lost, 16)])
    assert resp.status_code == 503, resp.text
    assert resp.headers["Retry-After"] and "storage unavailable" in resp.json()["error"]
    assert balanced(c)["acknowledged"] == 1  # nothing changed
    redis_server.start()
    assert ok(report(c, col["worker_id"], collect["task_id"], [(lost, 16)]))["accepted"] == 1
    assert balanced(c)["acknowledged"] == 2


@pytest.mark.parametrize("backend,snapshot_every", [
    ("directory", 3600.0), ("directory", 0.3), ("redis", 0.3)])
def test_queue_chunks_consumed_before_a_crash_are_not_handed_out_again(
        coordinator_pool, task_sink, tmp_path, backend, snapshot_every):
    """On-policy data is used once: the consumption is journalled, so neither the journal's
    inserts (no snapshot since) nor a snapshot taken while the chunks were in flight bring
    back what a learner reported used before the coordinator was killed. The rate limiter
    counts those chunks as handed out (else collectors would wait for a learner with nothing
    to take, and an on-policy run would stop dead after its coordinator restarts)."""
    cfg = make_config(**QUEUE, coordinator={**FAST_REAP, "heartbeat_timeout_s": 60.0,
                                            "snapshot_interval_s": snapshot_every})
    cfg["name"] = f"consumed-{uuid.uuid4().hex[:12]}"
    storage = REDIS_URL if backend == "redis" else tmp_path / "storage"
    c = coordinator_pool.start(cfg, storage)
    try:
        col, collect, lrn, _ = collector_and_learner(c, task_sink)
        ids = [uuid.uuid4().hex for _ in range(4)]
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 16) for cid in ids]))
        taken = ok(post(c, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 1,
                                       "num_batches": 2, "wait_s": 0,
                                       "by_buffer": {"rollouts": 1}}))["chunk_ids"]
        assert taken == ids[:2]
        if snapshot_every < 60:  # a snapshot holds them in flight (queued, once restored)
            generation = get(c, "/status")["ledger"]["journal_generation"]
            wait_for(lambda: get(c, "/status")["ledger"]["journal_generation"] > generation,
                     what="a snapshot with the chunks in flight")
        _learn_info(c, lrn["worker_id"], 1, [{"buffer": "rollouts", "chunk_ids": taken}])
        sigkill(c)

        c2 = coordinator_pool.start(cfg, storage, "--resume")
        assert buffer_ids(c2, "rollouts") == ids[2:]
        ledger = balanced(c2)
        assert (ledger["acknowledged"], ledger["consumed"], ledger["in_buffers"]) == (4, 2, 2)
        assert get(c2, "/buffers")["buffers"]["rollouts"]["sampled_items"] == 2 * 16
        register(c2, "learner", task_sink(), lrn["worker_id"])
        again = ok(post(c2, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 1,
                                        "num_batches": 8, "wait_s": 0,
                                        "by_buffer": {"rollouts": 1}}))["chunk_ids"]
        assert again == ids[2:]
    finally:
        if backend == "redis":
            _wipe_redis(cfg["name"])
