"""The coordinator's HTTP contract, against the real service in its own process.

Each test starts `python -m services.cli coordinator` (gunicorn, the real app) and talks to it
with `requests`; workers are real HTTP servers in this process that accept `POST /task` and
record what they were sent.
"""

from __future__ import annotations

import uuid
import zlib

import numpy as np
import pytest
import requests

from learner.batching import assemble
from shared.codec import decode_arrays, encode_arrays
from shared.storage import ChunkNotFound, DirectoryStorage

from .helpers import CoordinatorProc, TaskSink, wait_for

TIMEOUT = 10

# Every request closes its connection: a kept-alive socket held by a stray Response object
# makes gunicorn's graceful shutdown wait for it, which slowed every teardown by seconds.
HTTP = requests.Session()
HTTP.headers["Connection"] = "close"


# Configs (changes to `helpers.make_config`) of the coordinators this module's tests start.
DEFAULT: dict = {}
SMALL_BUFFER = {"buffer": {"capacity": 300}}
TIGHT_RATIO = {"algo": {"learning_starts": 0, "updates_per_env_step": 1.0,
                        "ratio_tolerance": 10}}
EARLY_EVAL = {"eval": {"every_env_steps": 256, "episodes": 4, "num_envs": 10,
                       "stop_value": 475}}


# Which coordinator each test takes; the tests on `quiet_cluster` share one.
BOOTS = {
    "test_register_pushes_tasks_and_heartbeats": DEFAULT,
    "test_registering_again_under_the_same_id_keeps_one_worker": DEFAULT,
    "test_leaving_ends_tasks_and_membership": DEFAULT,
    "test_chunks_sampling_and_learn_info": DEFAULT,
    "test_evicted_chunks_are_deleted_from_storage": SMALL_BUFFER,
    "test_replay_ratio_throttles_collectors_until_the_learner_samples": TIGHT_RATIO,
    "test_an_evaluation_at_the_stop_value_solves_the_run": EARLY_EVAL,
}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    """Boot the coordinators the selected tests will take, side by side."""
    mine = [item for item in request.session.items if item.module is request.module]
    names = {item.originalname for item in mine}
    boots = [cfg for name, cfg in BOOTS.items() if name in names]
    if any("quiet_cluster" in item.fixturenames for item in mine):
        boots.append(DEFAULT)
    coordinator_pool.prewarm(*boots)


# -- helpers ------------------------------------------------------------------------------

def post(c: CoordinatorProc, path: str, body=None, **kw) -> requests.Response:
    return HTTP.post(c.api(path), json=body, timeout=TIMEOUT, **kw)


def ok(resp: requests.Response) -> dict:
    assert resp.status_code == 200, f"{resp.status_code}: {resp.text}"
    return resp.json()


def register(c: CoordinatorProc, role: str, sink: TaskSink, worker_id: str | None = None
             ) -> dict:
    body = {"role": role, "url": sink.url}
    if worker_id is not None:
        body["worker_id"] = worker_id
    return ok(post(c, "/workers", body))


def task_state(c: CoordinatorProc, task_id: str) -> str:
    return ok(HTTP.get(c.api(f"/tasks/{task_id}"), timeout=TIMEOUT))["state"]


def wait_running(c: CoordinatorProc, task_id: str) -> None:
    wait_for(lambda: task_state(c, task_id) == "running", what=f"task {task_id} running")


def write_chunk(c: CoordinatorProc, n: int, chunk_id: str | None = None,
                version: int = -1) -> str:
    """Write a real chunk into the coordinator's storage directory, as a collector would."""
    chunk_id = chunk_id or uuid.uuid4().hex
    rng = np.random.default_rng(zlib.crc32(chunk_id.encode()))
    arrays = {"obs": rng.standard_normal((n, 4)).astype(np.float32),
              "action": rng.integers(0, 2, n).astype(np.int64),
              "reward": np.ones(n, np.float32),
              "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
              "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    DirectoryStorage(c.storage_dir).put_chunk(
        chunk_id, encode_arrays(arrays, {"policy_version": str(version)}))
    return chunk_id


def report(c: CoordinatorProc, worker_id: str, task_id: str, chunks: list[tuple[str, int]],
           **meta) -> requests.Response:
    return post(c, "/chunks", {"worker_id": worker_id, "task_id": task_id, "chunks": [
        {"chunk_id": cid, "length": n, "policy_version": -1, **meta} for cid, n in chunks]})


def collector_and_learner(c: CoordinatorProc, make_sink) -> tuple[dict, dict, dict, dict]:
    """Register one of each with a fake worker server; returns (collector, collect task,
    learner, learn task) once both tasks were pushed and acknowledged."""
    col_sink, lrn_sink = make_sink(), make_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", lrn_sink)
    collect = col_sink.wait_task("collect")
    learn = lrn_sink.wait_task("learn")
    wait_running(c, collect["task_id"])
    wait_running(c, learn["task_id"])
    assert not col_sink.errors and not lrn_sink.errors
    return col, collect, lrn, learn


def comparable_status(c: CoordinatorProc) -> dict:
    """/status without what moves with the clock."""
    s = c.status()
    s["run"].pop("wall_seconds")
    s.pop("rates")
    for w in s["workers"]:
        w.pop("seconds_since_heartbeat")
    return s


# -- membership and task pushes -----------------------------------------------------------

def test_register_pushes_tasks_and_heartbeats(coordinator, task_sink):
    c = coordinator()
    col_sink, lrn_sink = task_sink(), task_sink()
    col = register(c, "collector", col_sink)
    assert col["worker_id"].startswith("collector")
    assert col["run_name"] == c.config["name"]
    assert col["storage"] == str(c.storage_dir)
    assert col["config"]["algo"]["learning_starts"] == c.config["algo"]["learning_starts"]
    assert col["heartbeat_interval_s"] == c.config["coordinator"]["heartbeat_interval_s"]
    lrn = register(c, "learner", lrn_sink, worker_id="learner-a")
    assert lrn["worker_id"] == "learner-a"

    collect = col_sink.wait_task("collect")
    learn = lrn_sink.wait_task("learn")
    assert isinstance(collect["seed"], int) and isinstance(learn["seed"], int)
    assert col_sink.tasks("learn") == [] and lrn_sink.tasks("collect") == []
    assert not col_sink.errors and not lrn_sink.errors
    wait_running(c, collect["task_id"])
    wait_running(c, learn["task_id"])

    hb = ok(post(c, f"/workers/{col['worker_id']}/heartbeat", {"status": {"env_steps_s": 1.5}}))
    assert hb == {"stop": False, "paused": False, "policy_version": None, "env_steps": 0}
    worker = ok(HTTP.get(c.api(f"/workers/{col['worker_id']}"), timeout=TIMEOUT))
    assert worker["state"] == "alive" and worker["role"] == "collector"
    assert worker["status"] == {"env_steps_s": 1.5}
    ok(post(c, "/workers/learner-a/heartbeat"))  # an empty body is an empty status

    roles = sorted(w["role"] for w in c.status()["workers"])
    assert roles == ["collector", "learner"]
    tasks = {t["task_id"]: t for t in c.status()["tasks"]}
    assert tasks[collect["task_id"]]["worker_id"] == col["worker_id"]
    assert tasks[learn["task_id"]]["worker_id"] == "learner-a"


def test_registering_again_under_the_same_id_keeps_one_worker(coordinator, task_sink):
    c = coordinator()
    old_sink, new_sink = task_sink(), task_sink()
    register(c, "collector", old_sink, worker_id="col-1")
    first = old_sink.wait_task("collect")
    wait_running(c, first["task_id"])

    again = register(c, "collector", new_sink, worker_id="col-1")   # a restart elsewhere
    assert again["worker_id"] == "col-1"
    second = new_sink.wait_task("collect")
    assert second["task_id"] != first["task_id"]
    workers = c.status()["workers"]
    assert len(workers) == 1
    assert workers[0]["registrations"] == 2 and workers[0]["url"] == new_sink.url
    assert task_state(c, first["task_id"]) == "failed"
    wait_running(c, second["task_id"])
    # the new task carries the worker's chunks
    cid = write_chunk(c, 8)
    assert ok(report(c, "col-1", second["task_id"], [(cid, 8)]))["env_steps"] == 8


def test_leaving_ends_tasks_and_membership(coordinator, task_sink):
    c = coordinator()
    col, collect, lrn, learn = collector_and_learner(c, task_sink)
    wid = col["worker_id"]
    left = ok(HTTP.delete(c.api(f"/workers/{wid}"), timeout=TIMEOUT))
    assert left["state"] == "left" and left["worker_id"] == wid
    assert task_state(c, collect["task_id"]) == "finished"
    assert task_state(c, learn["task_id"]) == "running"
    assert post(c, f"/workers/{wid}/heartbeat", {}).status_code == 404
    cid = write_chunk(c, 8)
    r = report(c, wid, collect["task_id"], [(cid, 8)])
    assert r.status_code == 404 and r.json()["field"] == "worker_id"
    assert c.status()["counters"]["env_steps"] == 0
    states = {w["worker_id"]: w["state"] for w in c.status()["workers"]}
    assert states == {wid: "left", lrn["worker_id"]: "alive"}
    # coming back is a registration
    back = task_sink()
    register(c, "collector", back, worker_id=wid)
    back.wait_task("collect")
    assert {w["worker_id"]: w["state"] for w in c.status()["workers"]}[wid] == "alive"


# -- experience, sampling, learning ---------------------------------------------------------

def test_chunks_sampling_and_learn_info(coordinator, task_sink):
    c = coordinator()
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, tid, lid = col["worker_id"], collect["task_id"], lrn["worker_id"]
    starts = c.config["algo"]["learning_starts"]
    sample = {"worker_id": lid, "batch_size": 16, "num_batches": 4}

    lengths = {write_chunk(c, n): n for n in (100, 60)}                    # 160 < starts
    r = ok(report(c, wid, tid, list(lengths.items()),
                  episode_returns=[10.0, 30.0], episode_lengths=[10, 30]))
    assert r["accepted"] == 2 and r["env_steps"] == 160 and r["stop"] is False
    s = c.status()
    assert s["buffer"]["size"] == 160 and s["buffer"]["chunks"] == 2
    assert s["counters"]["env_steps"] == 160 and s["counters"]["chunks_accepted"] == 2
    assert s["counters"]["episodes"] == 4
    assert s["collect"]["episode_return_mean"] == pytest.approx(20.0)

    # not enough env steps yet: no batches, and a hint when to come back
    early = ok(post(c, "/sample", sample))
    assert early["chunk_ids"] == [] and early["rows"] == [] and early["retry_after_s"] > 0
    assert early["env_steps"] == 160

    more = {write_chunk(c, 128): 128}
    lengths.update(more)
    r = ok(report(c, wid, tid, list(more.items())))
    assert r["env_steps"] == 288 >= starts

    # a retried report counts nothing twice, nor does an id listed twice in one report
    r = ok(report(c, wid, tid, list(lengths.items())))
    assert r["accepted"] == 0 and r["env_steps"] == 288
    twice = write_chunk(c, 50)
    r = ok(report(c, wid, tid, [(twice, 50), (twice, 50)],
                  episode_returns=[1.0], episode_lengths=[50]))
    assert r["accepted"] == 1 and r["env_steps"] == 338
    lengths[twice] = 50
    s = c.status()
    assert s["buffer"]["size"] == 338 and s["buffer"]["chunks"] == 4
    assert s["counters"]["chunks_accepted"] == 4 and s["counters"]["episodes"] == 5

    got = ok(post(c, "/sample", sample))
    assert len(got["chunk_index"]) == 4 and all(len(b) == 16 for b in got["chunk_index"])
    assert set(got["chunk_ids"]) <= set(lengths)
    for b in range(4):
        for k, row in zip(got["chunk_index"][b], got["rows"][b], strict=True):
            assert 0 <= row < lengths[got["chunk_ids"][k]]
    # the references resolve against storage into real batches
    store = DirectoryStorage(c.storage_dir)
    chunks = [decode_arrays(blob)[0] for blob in store.get_chunks(got["chunk_ids"])]
    batches = assemble(chunks, np.asarray(got["chunk_index"]), np.asarray(got["rows"]))
    assert len(batches) == 4 and batches[0]["obs"].shape == (16, 4)
    assert c.status()["counters"]["granted_iterations"] == 4
    assert c.status()["buffer"]["sampled_items"] == 64

    info = ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 4,
                                      "policy_version": 0, "metrics": {"train/loss": 0.5}}))
    assert info == {"stop": False}
    s = c.status()
    assert s["counters"]["policy_version"] == 0 and s["counters"]["train_iterations"] == 4
    assert s["train"] == {"train/loss": 0.5}
    hb = ok(post(c, f"/workers/{wid}/heartbeat", {}))
    assert hb["policy_version"] == 0 and hb["env_steps"] == 338
    # versions and iterations never go backwards
    ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 1, "policy_version": -1}))
    assert c.status()["counters"]["policy_version"] == 0
    assert c.status()["counters"]["train_iterations"] == 4


def test_evicted_chunks_are_deleted_from_storage(coordinator, task_sink):
    c = coordinator(**SMALL_BUFFER)
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ids = [write_chunk(c, 128) for _ in range(4)]
    for cid in ids:
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 128)]))
    s = c.status()
    assert s["buffer"]["size"] == 256 and s["buffer"]["evicted_chunks"] == 2
    assert s["counters"]["env_steps"] == 512
    store = DirectoryStorage(c.storage_dir)
    wait_for(lambda: store.list_chunks() == sorted(ids[2:]), what="janitor deleting chunks")
    with pytest.raises(ChunkNotFound):
        store.get_chunk(ids[0])


def test_replay_ratio_throttles_collectors_until_the_learner_samples(coordinator, task_sink):
    c = coordinator(**TIGHT_RATIO)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid = col["worker_id"]
    r = ok(report(c, wid, collect["task_id"], [(write_chunk(c, 128), 128)]))
    assert r["throttle_s"] > 0
    permit = ok(post(c, "/permits/collect", {"worker_id": wid, "wait_s": 0.1}))
    assert permit == {"granted": False, "stop": False}
    got = ok(post(c, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 8,
                                 "num_batches": 1000}))
    assert len(got["rows"]) == 128 + 10   # the line plus the tolerance band
    permit = ok(post(c, "/permits/collect", {"worker_id": wid, "wait_s": 0.1}))
    assert permit == {"granted": True, "stop": False}
    again = ok(post(c, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 8,
                                   "num_batches": 1}))
    assert again["rows"] == [] and again["retry_after_s"] > 0


# -- evaluation and stopping -------------------------------------------------------------------

def test_an_evaluation_at_the_stop_value_solves_the_run(coordinator, task_sink):
    c = coordinator(**EARLY_EVAL)
    col_sink, lrn_sink = task_sink(), task_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", lrn_sink)
    wid, lid = col["worker_id"], lrn["worker_id"]
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])

    ok(report(c, wid, collect["task_id"], [(write_chunk(c, 256), 256)]))
    # Enough env steps, but no policy to evaluate yet: the report woke the scheduler, which
    # ticks every 0.2 s here; over several ticks no evaluation may start.
    col_sink.expect_none("evaluate", within_s=0.7)
    assert not [t for t in c.status()["tasks"] if t["kind"] == "evaluate"]

    ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 10, "policy_version": 0}))
    ev = col_sink.wait_task("evaluate")
    assert ev["policy_version"] == 0 and ev["episodes"] == 4 and ev["num_envs"] == 4
    assert lrn_sink.tasks("evaluate") == []
    wait_running(c, ev["task_id"])

    body = {"worker_id": wid, "task_id": ev["task_id"], "policy_version": 0,
            "returns": [100.0, 120.0, 80.0, 100.0], "lengths": [100, 120, 80, 100]}
    # only the worker that was given the task may report it, and only as an evaluation
    r = post(c, "/evaluations", {**body, "worker_id": lid})
    assert r.status_code == 409 and r.json()["field"] == "task_id"
    r = post(c, "/evaluations", {**body, "task_id": collect["task_id"]})
    assert r.status_code == 409 and r.json()["field"] == "task_id"
    r = report(c, wid, ev["task_id"], [(write_chunk(c, 8), 8)])
    assert r.status_code == 409

    result = ok(post(c, "/evaluations", body))
    assert result["return_mean"] == pytest.approx(100.0)
    assert result["episodes"] == 4 and result["env_steps"] == 256
    assert result["train_iterations"] == 10
    s = c.status()
    assert s["run"]["state"] == "running" and s["run"]["solved"] is False
    assert s["latest_evaluation"]["return_mean"] == pytest.approx(100.0)
    assert task_state(c, ev["task_id"]) == "finished"

    # the next evaluation is due every_env_steps later
    # (the new version first: the report that makes it due wakes the scheduler at once)
    ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 20, "policy_version": 1}))
    ok(report(c, wid, collect["task_id"], [(write_chunk(c, 256), 256)]))
    wait_for(lambda: len(col_sink.tasks("evaluate")) == 2, what="second evaluate task")
    ev2 = col_sink.tasks("evaluate")[-1]
    assert ev2["policy_version"] == 1 and ev2["task_id"] != ev["task_id"]
    # exactly the stop value is enough
    result = ok(post(c, "/evaluations", {**body, "task_id": ev2["task_id"], "policy_version": 1,
                                         "returns": [475.0, 470.0, 480.0, 475.0]}))
    assert result["return_mean"] == 475.0

    s = c.status()
    assert s["run"]["state"] == "stopped" and s["run"]["solved"] is True
    assert "solved" in s["run"]["stop_reason"]
    assert s["best_evaluation"]["task_id"] == ev2["task_id"]
    evals = ok(HTTP.get(c.api("/evaluations"), timeout=TIMEOUT))["evaluations"]
    assert [e["task_id"] for e in evals] == [ev["task_id"], ev2["task_id"]]
    # every worker hears about it on its next call
    assert ok(post(c, f"/workers/{wid}/heartbeat", {}))["stop"] is True
    assert ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 21,
                                      "policy_version": 1}))["stop"] is True
    assert ok(report(c, wid, collect["task_id"], [(write_chunk(c, 8), 8)]))["stop"] is True
    assert ok(post(c, "/sample", {"worker_id": lid, "batch_size": 4,
                                  "num_batches": 1}))["stop"] is True
    # and a worker joining a stopped run is given no task
    late_sink = task_sink()
    late = register(c, "collector", late_sink)
    assert not [t for t in c.status()["tasks"] if t["worker_id"] == late["worker_id"]]
    late_sink.expect_none("collect", within_s=0.3)


# -- bad input ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quiet_cluster(module_coordinator, module_task_sink):
    """One coordinator with a registered collector and learner whose tasks are running and
    some experience buffered, shared by the bad-input cases (none of which may change it)."""
    c = module_coordinator
    col, collect, lrn, learn = collector_and_learner(c, module_task_sink)
    cid = write_chunk(c, 64)
    ok(report(c, col["worker_id"], collect["task_id"], [(cid, 64)]))
    return {"c": c, "wid": col["worker_id"], "tid": collect["task_id"],
            "lid": lrn["worker_id"], "learn_tid": learn["task_id"], "cid": cid}


def _chunk_body(q, **chunk):
    return {"worker_id": q["wid"], "task_id": q["tid"],
            "chunks": [{"chunk_id": "fresh-1", "length": 5, "policy_version": 0, **chunk}]}


# (name, path, body, expected status, expected field). The body is a dict sent as JSON,
# raw bytes, or a function of `quiet_cluster` returning a dict; `{wid}` and `{tid}` in the
# path are the cluster's collector and its collect task.
BAD = [
    # registration
    ("register malformed", "/workers", b'{"role": "collector", ', 400, None),
    ("register unknown field", "/workers",
     {"role": "collector", "url": "http://x:1", "colour": "red"}, 400, "colour"),
    ("register wrong type", "/workers", {"role": 5, "url": "http://x:1"}, 400, "role"),
    ("register bad role", "/workers", {"role": "boss", "url": "http://x:1"}, 400, "role"),
    ("register missing role", "/workers", {"url": "http://x:1"}, 400, "role"),
    ("register empty body", "/workers", b"", 400, "role"),
    ("register bad url", "/workers", {"role": "learner", "url": "ftp://x"}, 400, "url"),
    ("register bad id", "/workers",
     {"role": "learner", "url": "http://x:1", "worker_id": "../x"}, 400, "worker_id"),
    ("register json list", "/workers", b"[1, 2]", 400, None),
    ("register json null", "/workers", b"null", 400, None),
    # heartbeat
    ("heartbeat malformed", "/workers/{wid}/heartbeat", b"{status", 400, None),
    ("heartbeat unknown field", "/workers/{wid}/heartbeat", {"statuz": {}}, 400, "statuz"),
    ("heartbeat wrong type", "/workers/{wid}/heartbeat", {"status": {"a": "fast"}}, 400,
     "status.a"),
    ("heartbeat status not a map", "/workers/{wid}/heartbeat", {"status": [1]}, 400,
     "status"),
    # chunk reports
    ("chunks malformed", "/chunks", b'{"worker_id": "x", "chunks": [}', 400, None),
    ("chunks unknown field", "/chunks", lambda q: {**_chunk_body(q), "extra": 1}, 400, "extra"),
    ("chunks unknown nested field", "/chunks", lambda q: _chunk_body(q, colour="red"), 400,
     "chunks.0.colour"),
    ("chunks wrong type", "/chunks", lambda q: _chunk_body(q, length="ten"), 400,
     "chunks.0.length"),
    ("chunks zero length", "/chunks", lambda q: _chunk_body(q, length=0), 400,
     "chunks.0.length"),
    ("chunks bad id", "/chunks", lambda q: _chunk_body(q, chunk_id="../etc"), 400,
     "chunks.0.chunk_id"),
    ("chunks episodes mismatch", "/chunks",
     lambda q: _chunk_body(q, episode_returns=[1.0], episode_lengths=[]), 400, "chunks.0"),
    ("chunks missing task", "/chunks",
     lambda q: {k: v for k, v in _chunk_body(q).items() if k != "task_id"}, 400, "task_id"),
    ("chunks missing length", "/chunks",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"],
                "chunks": [{"chunk_id": "fresh-1", "policy_version": 0}]}, 400,
     "chunks.0.length"),
    ("chunks empty list", "/chunks", lambda q: {**_chunk_body(q), "chunks": []}, 400, "chunks"),
    ("chunks unknown worker", "/chunks", lambda q: {**_chunk_body(q), "worker_id": "ghost"},
     404, "worker_id"),
    ("chunks unknown task", "/chunks", lambda q: {**_chunk_body(q), "task_id": "collect-999"},
     404, "task_id"),
    ("chunks someone else's task", "/chunks",
     lambda q: {**_chunk_body(q), "worker_id": q["lid"]}, 409, "task_id"),
    ("chunks on a learn task", "/chunks",
     lambda q: {**_chunk_body(q), "task_id": q["learn_tid"]}, 409, "task_id"),
    # sampling
    ("sample malformed", "/sample", b"{'worker_id': 'x'}", 400, None),
    ("sample unknown field", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1, "prio": 1}, 400,
     "prio"),
    ("sample wrong type", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": "big", "num_batches": 1}, 400,
     "batch_size"),
    ("sample missing field", "/sample", lambda q: {"worker_id": q["lid"], "batch_size": 4},
     400, "num_batches"),
    ("sample out of range", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 0, "num_batches": 1}, 400, "batch_size"),
    ("sample wait too long", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 1, "num_batches": 1, "wait_s": 3600},
     400, "wait_s"),
    ("sample unknown worker", "/sample",
     {"worker_id": "ghost", "batch_size": 4, "num_batches": 1}, 404, "worker_id"),
    # learn-info
    ("learn-info malformed", "/learn-info", b"not json at all", 400, None),
    ("learn-info unknown field", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "loss": 1.0}, 400, "loss"),
    ("learn-info wrong type", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": "v1"}, 400,
     "policy_version"),
    ("learn-info missing field", "/learn-info",
     lambda q: {"worker_id": q["lid"], "policy_version": 0}, 400, "train_iterations"),
    ("learn-info bad metric", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "metrics": {"train/loss": "low"}}, 400, "metrics.train/loss"),
    ("learn-info version below -1", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": -2}, 400,
     "policy_version"),
    ("learn-info unknown worker", "/learn-info",
     {"worker_id": "ghost", "train_iterations": 1, "policy_version": 0}, 404, "worker_id"),
    # evaluations
    ("evaluation malformed", "/evaluations", b'{"returns": [1,2,]}', 400, None),
    ("evaluation unknown field", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": [1.0], "lengths": [1], "mean": 1.0}, 400, "mean"),
    ("evaluation wrong type", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": ["good"], "lengths": [1]}, 400, "returns.0"),
    ("evaluation missing field", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": [1.0]}, 400, "lengths"),
    ("evaluation no episodes", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": [], "lengths": []}, 400, "returns"),
    ("evaluation lengths mismatch", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": [1.0, 2.0], "lengths": [1]}, 400, None),
    ("evaluation of a collect task", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "returns": [1.0], "lengths": [1]}, 409, "task_id"),
    # collect permits and task results
    ("permit unknown field", "/permits/collect",
     lambda q: {"worker_id": q["wid"], "please": True}, 400, "please"),
    ("permit wrong type", "/permits/collect",
     lambda q: {"worker_id": q["wid"], "wait_s": "soon"}, 400, "wait_s"),
    ("permit missing field", "/permits/collect", {"wait_s": 0}, 400, "worker_id"),
    ("task finish unknown field", "/tasks/{tid}/finish", {"done": True}, 400, "done"),
    ("task finish wrong type", "/tasks/{tid}/finish", {"error": 5}, 400, "error"),
    ("task finish by someone else", "/tasks/{tid}/finish", lambda q: {"worker_id": q["lid"]},
     409, "task_id"),
    ("task fail unknown task", "/tasks/collect-999/fail", {"error": "boom"}, 404, "task_id"),
]


@pytest.mark.parametrize("name,path,body,status,field", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_rejected_naming_the_field_and_changes_nothing(
        quiet_cluster, name, path, body, status, field):
    q = quiet_cluster
    c: CoordinatorProc = q["c"]
    before = comparable_status(c)
    url = c.api(path.format(**q))
    if callable(body):
        body = body(q)
    if isinstance(body, bytes):
        r = HTTP.post(url, data=body, headers={"Content-Type": "application/json"},
                          timeout=TIMEOUT)
    else:
        r = HTTP.post(url, json=body, timeout=TIMEOUT)
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    answer = r.json()
    assert isinstance(answer["error"], str) and answer["error"]
    assert answer["field"] == field, answer
    if field is not None and status == 400:
        assert field in answer["error"]
    assert comparable_status(c) == before


def test_other_bad_requests_answer_json(quiet_cluster):
    q = quiet_cluster
    c: CoordinatorProc = q["c"]
    before = comparable_status(c)
    heartbeat = c.api(f"/workers/{q['wid']}/heartbeat")
    r = HTTP.post(heartbeat, data=b"status=1",
                      headers={"Content-Type": "application/x-www-form-urlencoded"},
                      timeout=TIMEOUT)
    assert r.status_code == 400 and "Content-Type" in r.json()["error"]
    r = HTTP.post(c.api("/workers"), data=b"{" + b" " * (9 * 1024 * 1024) + b"}",
                      headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code == 413 and "error" in r.json()
    r = HTTP.get(c.api("/no-such-thing"), timeout=TIMEOUT)
    assert r.status_code == 404 and "error" in r.json()
    r = HTTP.get(c.api("/sample"), timeout=TIMEOUT)
    assert r.status_code == 405 and "error" in r.json()
    assert comparable_status(c) == before


def test_unknown_workers_and_tasks_are_404(quiet_cluster):
    c: CoordinatorProc = quiet_cluster["c"]
    before = comparable_status(c)
    r = post(c, "/workers/nobody-1/heartbeat", {})
    assert r.status_code == 404
    assert r.json()["field"] == "worker_id" and "nobody-1" in r.json()["error"]
    r = HTTP.get(c.api("/workers/nobody-1"), timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["field"] == "worker_id"
    r = HTTP.delete(c.api("/workers/nobody-1"), timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["field"] == "worker_id"
    r = HTTP.get(c.api("/tasks/collect-999"), timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["field"] == "task_id"
    assert comparable_status(c) == before
