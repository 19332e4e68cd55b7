"""The coordinator's HTTP contract, against the real service in its own process.

Each test starts `python -m rlfleet coordinator` (the real app, on cheroot) and talks to it
with `requests`; workers are real HTTP servers in this process that accept `POST /task` and
record what they were sent.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlfleet.shared.batching.batching import assemble
from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.sampling import SampleResponse
from rlfleet.shared.contract.wire.status import Status
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import ChunkNotFound, DirectoryStorage, evaluated_blob
from rlfleet.shared.run.config import parse_config

from .helpers import (
    HTTP,
    TIMEOUT,
    CoordinatorProc,
    buffer_config,
    closed_port,
    collector_and_learner,
    comparable_status,
    get,
    ok,
    post,
    prewarm_module,
    register,
    report,
    task_state,
    wait_for,
    wait_running,
    write_chunk,
)

# Configs (changes to `helpers.make_config`) of the coordinators this module's tests start.
DEFAULT: dict = {}
SMALL_BUFFER = {"buffers": {"replay": buffer_config(capacity=300)}}
RARE_SNAPSHOTS = {"buffers": {"replay": buffer_config(capacity=300)},
                  "coordinator": {"snapshot_interval_s": 3600}}
# One update of 8 items per env step from the first item on; either side may run 10
# updates ahead. (The learner below asks for batches of 8, the config's batch size.)
TIGHT_RATIO = {"algo": {"batch_size": 8}, "buffers": {"replay": buffer_config(
    rate_limit={"min_size": 1, "samples_per_insert": 8, "error_buffer": 80})}}
EARLY_EVAL = {"eval": {"every_env_steps": 256, "episodes": 4, "num_envs": 10,
                       "stop_value": 475}}

EVAL_BY_ITERATIONS = {"eval": {"every_env_steps": None, "every_train_iterations": 100,
                               "episodes": 3, "num_envs": 3, "stochastic": False,
                               "stop_value": 475}}


# Which coordinator each test takes; the tests on `quiet_cluster` share one.
BOOTS = {
    "test_register_pushes_tasks_and_heartbeats": DEFAULT,
    "test_registering_again_under_the_same_id_keeps_one_worker": DEFAULT,
    "test_leaving_ends_tasks_and_membership": DEFAULT,
    "test_chunks_sampling_and_learn_info": DEFAULT,
    "test_evicted_chunks_are_deleted_from_storage": SMALL_BUFFER,
    "test_an_evicted_chunk_outlives_every_snapshot_that_refers_to_it": RARE_SNAPSHOTS,
    "test_replay_ratio_throttles_collectors_until_the_learner_samples": TIGHT_RATIO,
    "test_an_evaluation_at_the_stop_value_solves_the_run": EARLY_EVAL,
    "test_evaluations_can_follow_train_iterations": EVAL_BY_ITERATIONS,
    "test_the_status_answer_is_the_status_schema": EARLY_EVAL,
}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    """Boot the coordinators the selected tests will take, side by side."""
    prewarm_module(request, coordinator_pool, BOOTS, {"quiet_cluster": DEFAULT})


# -- helpers ------------------------------------------------------------------------------



# -- membership and task pushes -----------------------------------------------------------

def test_register_pushes_tasks_and_heartbeats(coordinator, task_sink):
    c = coordinator()
    col_sink, lrn_sink = task_sink(), task_sink()
    col = register(c, "collector", col_sink)
    assert col["worker_id"].startswith("collector")
    assert col["run_name"] == c.config["name"]
    assert col["storage"] == str(c.storage_dir)
    assert parse_config(col["config"]) == parse_config(c.config)  # the run's whole config
    assert col["config"]["buffers"]["replay"]["rate_limit"]["min_size"] == 256
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
    assert hb == {"stop": False, "paused": False, "policy_version": None, "env_steps": 0,
                  "group_generation": None}  # a collector is in no learner group
    hb = ok(post(c, f"/workers/{lrn['worker_id']}/heartbeat", {"status": {}}))
    assert hb["group_generation"] == 0  # no learner has joined the group yet
    worker = get(c, f"/workers/{col['worker_id']}")
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

    old_sink.close()  # the old process is gone: nothing answers at its URL
    again = register(c, "collector", new_sink, worker_id="col-1")   # a restart elsewhere
    assert again["worker_id"] == "col-1"
    # the restarted worker gets its own task back, with a new seed so the new
    # process does not replay the old one's episodes
    second = new_sink.wait_task("collect")
    assert second["task_id"] == first["task_id"] and second["seed"] != first["seed"]
    workers = c.status()["workers"]
    assert len(workers) == 1
    assert workers[0]["registrations"] == 2 and workers[0]["url"] == new_sink.url
    assert get(c, f"/tasks/{first['task_id']}")["reassignments"] == 1
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
    min_size = c.config["buffers"]["replay"]["rate_limit"]["min_size"]
    sample = {"worker_id": lid, "batch_size": 16, "num_batches": 4}

    lengths = {write_chunk(c, n): n for n in (100, 60)}                    # 160 < min_size
    r = ok(report(c, wid, tid, list(lengths.items()),
                  episode_returns=[10.0, 30.0], episode_lengths=[10, 30]))
    assert r["accepted"] == 2 and r["env_steps"] == 160 and r["stop"] is False
    s = c.status()
    assert s["buffer"]["size"] == 160 and s["buffer"]["chunks"] == 2
    assert s["buffers"]["replay"]["size"] == 160
    assert s["buffers"]["replay"]["inserted_chunks"] == 2
    assert s["counters"]["env_steps"] == 160 and s["counters"]["chunks_accepted"] == 2
    assert s["counters"]["episodes"] == 4
    assert s["collect"]["episode_return_mean"] == pytest.approx(20.0)

    # not enough items yet: no batches, but 429 and a hint when to come back
    early = post(c, "/sample", sample)
    assert early.status_code == 429, early.text
    assert float(early.headers["Retry-After"]) > 0
    assert early.json()["retry_after_s"] > 0 and early.json()["error"]
    # our client, out of retries, still says it was a 429 (learners wait on it, quietly)
    with pytest.raises(HttpError) as exhausted:
        HttpClient(c.url, retries=0).post("/api/v1/sample", sample)
    assert exhausted.value.status == 429
    with pytest.raises(HttpError) as unreachable:
        HttpClient(f"http://127.0.0.1:{closed_port()}", retries=0).get("/health")
    assert unreachable.value.status is None

    more = {write_chunk(c, 128): 128}
    lengths.update(more)
    r = ok(report(c, wid, tid, list(more.items())))
    assert r["env_steps"] == 288 >= min_size

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
    assert s["buffers"]["replay"]["inserted_items"] == 338
    assert s["buffers"]["replay"]["inserted_chunks"] == 4
    assert s["counters"]["chunks_accepted"] == 4 and s["counters"]["episodes"] == 5

    got = ok(post(c, "/sample", sample))
    assert got["num_batches"] == 4 and got["env_steps"] == 338
    [part] = got["parts"]
    assert part["buffer"] == "replay" and part["key"] is None
    assert part["weights"] is None and part["lengths"] is None  # uniform: no IS weights
    assert len(part["chunk_index"]) == 4 and all(len(b) == 16 for b in part["chunk_index"])
    assert np.shape(part["rows"]) == np.shape(part["item_ids"]) == (4, 16)
    assert set(got["chunk_ids"]) <= set(lengths)
    assert len(set(got["chunk_ids"])) == len(got["chunk_ids"])
    for b in range(4):
        for k, row in zip(part["chunk_index"][b], part["rows"][b], strict=True):
            assert 0 <= row < lengths[got["chunk_ids"][k]]
    # the references resolve against storage into real batches
    resp = SampleResponse.model_validate(got)
    store = DirectoryStorage(c.storage_dir)
    chunks = [decode_arrays(blob)[0] for blob in store.get_chunks(resp.chunk_ids)]
    batches = assemble(chunks, resp.parts, resp.num_batches)
    assert len(batches) == 4 and batches[0].data["obs"].shape == (16, 4)
    assert batches[0].weights is None and batches[0].item_refs == []
    s = c.status()
    assert s["counters"]["granted_batches"] == 4
    assert s["buffers"]["replay"]["sampled_items"] == 64

    info = ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 4,
                                      "policy_version": 0, "metrics": {"train/loss": 0.5}}))
    assert info == {"stop": False, "best_policy_version": None}
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
    """A ring of 300 transitions takes four chunks of 128 (uids 0..511): chunk 0 (slots
    0..127) is overwritten by chunks 2 and 3, chunk 1 (slots 128..255) only up to slot 211,
    so its rows 84..127 are still items: it must stay in storage."""
    c = coordinator(**SMALL_BUFFER)
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ids = [write_chunk(c, 128) for _ in range(4)]
    for cid in ids:
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 128)]))
    s = c.status()
    assert s["buffer"]["size"] == 300 and s["buffer"]["chunks"] == 3
    replay = s["buffers"]["replay"]
    assert replay["size"] == 300 and replay["capacity"] == 300
    assert replay["inserted_items"] == 512 and replay["evicted_items"] == 212
    assert replay["inserted_chunks"] == 4 and replay["released_chunks"] == 1
    assert s["counters"]["env_steps"] == 512
    store = DirectoryStorage(c.storage_dir)
    wait_for(lambda: store.list_chunks() == sorted(ids[1:]), what="janitor deleting chunks")
    with pytest.raises(ChunkNotFound):
        store.get_chunk(ids[0])


def test_an_evicted_chunk_outlives_every_snapshot_that_refers_to_it(
        coordinator, coordinator_pool, task_sink):
    """Deleting a released chunk waits for a snapshot taken after the release: a restart
    restores from the last snapshot, which must never refer to a deleted chunk."""
    c = coordinator(**RARE_SNAPSHOTS)
    col, collect, _, _ = collector_and_learner(c, task_sink)
    ids = [write_chunk(c, 128) for _ in range(4)]
    for cid in ids:
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 128)]))
    assert c.status()["buffers"]["replay"]["released_chunks"] == 1
    store = DirectoryStorage(c.storage_dir)
    # no snapshot since chunk 0 left the buffer: it stays in storage for now
    time.sleep(0.5)  # a window in which a janitor that did not wait would delete it
    assert store.list_chunks() == sorted(ids)
    # SIGTERM: the closing snapshot no longer refers to chunk 0, then chunk 0 goes
    assert coordinator_pool.stop(c) == 0, c.log()
    assert store.list_chunks() == sorted(ids[1:])
    resumed = coordinator_pool.start(c.config, c.storage_dir, "--resume",
                                     "--name", c.config["name"])
    s = resumed.status()
    assert s["buffer"] == {"size": 300, "chunks": 3}
    assert s["counters"]["env_steps"] == 512


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
    # the line ((128 - min_size) x 8 items) plus the error buffer (80 items), in batches of 8
    assert got["num_batches"] == len(got["parts"][0]["rows"]) == (127 * 8 + 80) // 8
    assert c.status()["buffers"]["replay"]["sampled_items"] == 127 * 8 + 80
    permit = ok(post(c, "/permits/collect", {"worker_id": wid, "wait_s": 0.1}))
    assert permit == {"granted": True, "stop": False}
    again = post(c, "/sample", {"worker_id": lrn["worker_id"], "batch_size": 8,
                                "num_batches": 1})
    assert again.status_code == 429 and float(again.headers["Retry-After"]) > 0
    assert c.status()["counters"]["granted_batches"] == 137


# -- evaluation and stopping -------------------------------------------------------------------

def test_evaluations_can_follow_train_iterations(coordinator, task_sink):
    c = coordinator(**EVAL_BY_ITERATIONS)
    col_sink = task_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", task_sink())
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 256), 256)]))
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 99,
                               "policy_version": 0}))
    col_sink.expect_none("evaluate", within_s=0.5)  # env steps do not count here
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 100,
                               "policy_version": 1}))
    ev = col_sink.wait_task("evaluate")
    assert ev["policy_version"] == 1 and ev["stochastic"] is False
    # the next one is due 100 iterations after the one that started it
    wait_running(c, ev["task_id"])
    ok(post(c, "/evaluations", {"worker_id": col["worker_id"], "task_id": ev["task_id"],
                                "policy_version": 1,
                                "deterministic": {"returns": [9.0] * 3, "lengths": [9] * 3}}))
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 199,
                               "policy_version": 2}))
    col_sink.expect_none("evaluate", within_s=0.5, after=1)
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 200,
                               "policy_version": 3}))
    wait_for(lambda: len(col_sink.tasks("evaluate")) == 2, what="second evaluate task")


def test_no_evaluation_before_start_env_steps(coordinator, task_sink):
    c = coordinator(eval={"every_env_steps": 64, "start_env_steps": 512,
                          "every_train_iterations": 1})
    col_sink = task_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", task_sink())
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 5,
                               "policy_version": 0}))
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 256), 256)]))
    col_sink.expect_none("evaluate", within_s=0.5)  # due by both schedules, but too early
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 256), 256)]))
    assert col_sink.wait_task("evaluate")["policy_version"] == 0


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
            "deterministic": {"returns": [100.0, 120.0, 80.0, 100.0],
                              "lengths": [100, 120, 80, 100]},
            "stochastic": {"returns": [50.0, 70.0], "lengths": [50, 70]}}
    # only the worker that was given the task may report it, and only as an evaluation
    r = post(c, "/evaluations", {**body, "worker_id": lid})
    assert r.status_code == 409 and r.json()["field"] == "task_id"
    r = post(c, "/evaluations", {**body, "task_id": collect["task_id"]})
    assert r.status_code == 409 and r.json()["field"] == "task_id"
    r = report(c, wid, ev["task_id"], [(write_chunk(c, 8), 8)])
    assert r.status_code == 409

    # the collector keeps the weights it evaluated beside its report
    storage = DirectoryStorage(c.storage_dir)
    storage.put_blob(f"evaluated-{ev['task_id']}", b"weights of version 0")
    result = ok(post(c, "/evaluations", body))
    assert result["return_mean"] == pytest.approx(100.0)
    assert result["episodes"] == 4 and result["env_steps"] == 256
    assert result["train_iterations"] == 10
    assert result["deterministic"]["return_min"] == 80.0
    assert result["deterministic"]["return_max"] == 120.0
    assert result["stochastic"]["return_mean"] == pytest.approx(60.0)
    assert result["stochastic"]["episodes"] == 2
    s = c.status()
    assert s["run"]["state"] == "running" and s["run"]["solved"] is False
    assert s["latest_evaluation"]["return_mean"] == pytest.approx(100.0)
    assert s["metrics"]["eval/deterministic/return_mean"] == pytest.approx(100.0)
    assert s["metrics"]["eval/stochastic/length_mean"] == pytest.approx(60.0)
    assert task_state(c, ev["task_id"]) == "finished"
    # the best policy so far is kept; the evaluated copy is gone
    assert storage.get_blob("best_policy") == b"weights of version 0"
    assert storage.get_blob(f"evaluated-{ev['task_id']}") is None

    # the next evaluation is due every_env_steps later
    # (the new version first: the report that makes it due wakes the scheduler at once)
    ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 20, "policy_version": 1}))
    ok(report(c, wid, collect["task_id"], [(write_chunk(c, 256), 256)]))
    wait_for(lambda: len(col_sink.tasks("evaluate")) == 2, what="second evaluate task")
    ev2 = col_sink.tasks("evaluate")[-1]
    assert ev2["policy_version"] == 1 and ev2["task_id"] != ev["task_id"]
    # exactly the stop value is enough
    storage.put_blob(f"evaluated-{ev2['task_id']}", b"weights of version 1")
    result = ok(post(c, "/evaluations", {**body, "task_id": ev2["task_id"], "policy_version": 1,
                                         "deterministic": {"returns": [475.0, 470.0, 480.0, 475.0],
                                                           "lengths": [500, 500, 500, 500]},
                                         "stochastic": None}))
    assert result["return_mean"] == 475.0

    s = c.status()
    # the policy that reached the stop value is the run's best policy, also in the run dir
    assert storage.get_blob("best_policy") == b"weights of version 1"
    assert (c.run_dir / "best_policy.safetensors").read_bytes() == b"weights of version 1"
    assert "eval/stochastic/return_mean" not in s["metrics"]
    assert s["run"]["state"] == "stopped" and s["run"]["solved"] is True
    assert "solved" in s["run"]["stop_reason"]
    assert s["best_evaluation"]["task_id"] == ev2["task_id"]
    page = ok(HTTP.get(c.api("/evaluations"), timeout=TIMEOUT))
    assert [e["task_id"] for e in page["evaluations"]] == [ev["task_id"], ev2["task_id"]]
    assert [e["seq"] for e in page["evaluations"]] == [1, 2]
    assert (page["total"], page["next"], page["missed"], page["more"]) == (2, 2, 0, False)
    # paged by a cursor: one at a time, then nothing new
    first = ok(HTTP.get(c.api("/evaluations?limit=1"), timeout=TIMEOUT))
    assert [e["seq"] for e in first["evaluations"]] == [1] and first["more"] is True
    rest = ok(HTTP.get(c.api(f"/evaluations?since={first['next']}"), timeout=TIMEOUT))
    assert [e["seq"] for e in rest["evaluations"]] == [2] and rest["more"] is False
    assert ok(HTTP.get(c.api("/evaluations?since=2"), timeout=TIMEOUT))["evaluations"] == []
    for bad in ("since=-1", "limit=0", "limit=1001", "since=x", "after=1"):
        r = HTTP.get(c.api(f"/evaluations?{bad}"), timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["field"] == bad.split("=")[0], bad
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


# -- the status document --------------------------------------------------------------------

def _typed(value):
    """JSON with every leaf paired with its type, so 3 and 3.0 differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return type(value).__name__, value


def test_the_status_answer_is_the_status_schema(coordinator, task_sink):
    """`GET /status` answers `schemas.Status` and nothing else: read back through the model
    and dumped again, the answer is unchanged, types included. A field the answer had but
    the schema lacked would be dropped by the model (and the comparison would fail); one
    the schema had but the answer lacked would come back as its default."""
    c = coordinator(**EARLY_EVAL)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, lid = col["worker_id"], lrn["worker_id"]
    ok(post(c, f"/workers/{wid}/heartbeat", {"status": {"env_steps_s": 2.5}}))
    ok(report(c, wid, collect["task_id"], [(write_chunk(c, 256), 256)],
              episode_returns=[10.0, 30.0], episode_lengths=[100, 156]))
    ok(post(c, "/learner-group", {"worker_id": lid, "store_addr": "127.0.0.1:1"}))
    ok(post(c, "/learn-info", {"worker_id": lid, "train_iterations": 10, "policy_version": 0,
                               "metrics": {"train/loss": 0.5}}))
    ev = wait_for(lambda: [t for t in c.status()["tasks"] if t["kind"] == "evaluate"],
                  what="an evaluate task")[0]
    wait_running(c, ev["task_id"])
    ok(post(c, "/evaluations", {
        "worker_id": wid, "task_id": ev["task_id"], "policy_version": 0,
        "deterministic": {"returns": [100.0, 120.0], "lengths": [100, 120]},
        "stochastic": {"returns": [50.0, 70.0], "lengths": [50, 70]}}))

    answer = ok(HTTP.get(c.api("/status"), timeout=TIMEOUT))
    assert answer["workers"] and answer["tasks"] and answer["learner_group"]["ranks"]
    assert answer["latest_evaluation"] and answer["train"] == {"train/loss": 0.5}
    assert answer["metrics"]["eval/deterministic/episodes"] == 2
    assert answer["collect"]["episode_return_mean"] == 20.0
    again = Status.model_validate(answer).model_dump(mode="json")
    assert _typed(again) == _typed(answer)


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
    ("sample mix of an unknown buffer", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1,
                "mix": [{"buffer": "replay", "fraction": 0.5},
                        {"buffer": "nope", "fraction": 0.5}]}, 404, "mix.1.buffer"),
    ("sample by_buffer of an unknown buffer", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1,
                "by_buffer": {"nope": 4}}, 404, "by_buffer.nope"),
    ("sample mix not summing to one", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1,
                "mix": [{"buffer": "replay", "fraction": 0.5}]}, 400, None),
    ("sample mix and by_buffer", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1,
                "mix": [{"buffer": "replay", "fraction": 1.0}], "by_buffer": {"replay": 4}},
     400, None),
    ("sample mix fraction out of range", "/sample",
     lambda q: {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1,
                "mix": [{"buffer": "replay", "fraction": 1.5}]}, 400, "mix.0.fraction"),
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
    ("learn-info priorities of an unknown buffer", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "priorities": [{"buffer": "nope", "item_ids": [0], "priorities": [1.0]}]},
     404, "priorities.0.buffer"),
    ("learn-info priorities and ids mismatch", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "priorities": [{"buffer": "replay", "item_ids": [0, 1], "priorities": [1.0]}]},
     400, "priorities.0"),
    ("learn-info negative priority", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "priorities": [{"buffer": "replay", "item_ids": [0], "priorities": [-1.0]}]},
     400, "priorities.0.priorities"),
    ("learn-info batch log values and ids mismatch", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "batch_log": [{"train_iteration": 1, "buffer": "replay", "item_ids": [0, 1],
                               "values": {"td_error": [0.5]}}]},
     400, "batch_log.0"),
    ("learn-info batch log negative iteration", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "batch_log": [{"train_iteration": -1, "buffer": "replay", "item_ids": [0]}]},
     400, "batch_log.0.train_iteration"),
    ("learn-info consumed from an unknown buffer", "/learn-info",
     lambda q: {"worker_id": q["lid"], "train_iterations": 1, "policy_version": 0,
                "consumed": [{"buffer": "nope", "chunk_ids": [q["cid"]]}]},
     404, "consumed.0.buffer"),
    # evaluations
    ("evaluation malformed", "/evaluations", b'{"returns": [1,2,]}', 400, None),
    ("evaluation unknown field", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": [1.0], "lengths": [1]}, "mean": 1.0}, 400, "mean"),
    ("evaluation wrong type", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": ["good"], "lengths": [1]}}, 400,
     "deterministic.returns.0"),
    ("evaluation missing field", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": [1.0]}}, 400, "deterministic.lengths"),
    ("evaluation no episodes", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": [], "lengths": []}}, 400,
     "deterministic.returns"),
    ("evaluation lengths mismatch", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": [1.0, 2.0], "lengths": [1]}}, 400, "deterministic"),
    ("evaluation of a collect task", "/evaluations",
     lambda q: {"worker_id": q["wid"], "task_id": q["tid"], "policy_version": 0,
                "deterministic": {"returns": [1.0], "lengths": [1]}}, 409, "task_id"),
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


def test_a_failed_evaluation_leaves_no_weights_behind(coordinator, task_sink):
    """The collector stores what it evaluates as `evaluated-<task>` before it reports; an
    evaluation that fails (its env crashed) never reports, so the coordinator deletes them."""
    c = coordinator(**EARLY_EVAL)
    col_sink = task_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", task_sink())
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 256), 256)]))
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 10,
                               "policy_version": 0}))
    ev = col_sink.wait_task("evaluate")
    wait_running(c, ev["task_id"])
    storage = DirectoryStorage(c.storage_dir)
    storage.put_blob(evaluated_blob(ev["task_id"]), b"weights")
    ok(post(c, f"/tasks/{ev['task_id']}/fail", {"worker_id": col["worker_id"],
                                                "error": "evaluation crashed: RuntimeError"}))
    assert storage.get_blob(evaluated_blob(ev["task_id"])) is None
