"""Run control over HTTP on a real coordinator: pause and resume collection, scale, stop."""

from __future__ import annotations

import pytest

from .helpers import (
    collector_and_learner,
    get,
    ok,
    post,
    prewarm_module,
    report,
    write_chunk,
)


@pytest.fixture(scope="module", autouse=True)
def _prewarm(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, {
        "test_pause_throttles_collectors_until_resumed": {},
        "test_scale_is_recorded_and_validated": {},
        "test_stop_ends_the_run": {}})


def test_pause_throttles_collectors_until_resumed(coordinator, task_sink):
    c = coordinator()
    col, collect, _, _ = collector_and_learner(c, task_sink)
    wid = col["worker_id"]
    state = ok(post(c, "/run/pause", {}))
    assert state["state"] == "paused" and state["paused"] is True
    # a collector's next report is accepted, and it is told to wait for a permit
    r = ok(report(c, wid, collect["task_id"], [(write_chunk(c, 64), 64)]))
    assert r["accepted"] == 1 and r["throttle_s"] > 0
    assert ok(post(c, "/permits/collect", {"worker_id": wid, "wait_s": 0.2})) == {
        "granted": False, "stop": False}
    hb = ok(post(c, f"/workers/{wid}/heartbeat", {}))
    assert hb["paused"] is True
    assert c.status()["run"]["state"] == "paused"
    # resumed: the permit is granted, reports are not throttled (the free-running buffer)
    assert ok(post(c, "/run/resume", {}))["state"] == "running"
    assert ok(post(c, "/permits/collect", {"worker_id": wid, "wait_s": 0.2}))["granted"]
    r = ok(report(c, wid, collect["task_id"], [(write_chunk(c, 64), 64)]))
    assert r["throttle_s"] == 0
    assert get(c, "/run")["paused"] is False


def test_scale_is_recorded_and_validated(coordinator, task_sink):
    c = coordinator()
    collector_and_learner(c, task_sink)
    assert get(c, "/run")["collectors_desired"] is None
    state = ok(post(c, "/scale", {"collectors": 3}))
    assert state["collectors_desired"] == 3 and state["collectors_alive"] == 1
    assert c.status()["run"]["collectors_desired"] == 3
    for body, field in [({"collectors": -1}, "collectors"), ({"collectors": "many"},
                        "collectors"), ({}, "collectors"), ({"collectors": 2, "x": 1}, "x")]:
        r = post(c, "/scale", body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
    assert get(c, "/run")["collectors_desired"] == 3  # bad requests changed nothing
    # learners: the group is sized to the wish; a size the batch cannot split is refused
    state = ok(post(c, "/scale", {"learners": 2}))
    assert state["learners_desired"] == 2 and state["collectors_desired"] == 3
    assert state["learners_alive"] == 1
    for body, field in [({"learners": 3}, "learners"), ({"learners": 0}, "learners")]:
        r = post(c, "/scale", body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
    r = post(c, "/scale", {"learners": 3})
    assert "algo.batch_size=64 is not divisible by the 3 learners" in r.json()["error"]
    assert get(c, "/run")["learners_desired"] == 2


def test_stop_ends_the_run(coordinator, task_sink):
    c = coordinator()
    col, _, lrn, _ = collector_and_learner(c, task_sink)
    state = ok(post(c, "/run/stop", {}))
    assert state["state"] == "stopped" and state["stop_reason"] == "stopped by request"
    assert ok(post(c, f"/workers/{col['worker_id']}/heartbeat", {}))["stop"] is True
    assert c.status()["run"]["solved"] is False
