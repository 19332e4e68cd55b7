"""The learner group over HTTP, against a real coordinator process: joining, the shards a
rank gets, the answers to requests of an ended generation, what a rank stuck in a collective
asks, and where the group shows (/status, /metrics, `rlfleet status`)."""

from __future__ import annotations

import subprocess
import sys
import threading

import requests

from rlfleet.learner.group.member import GroupMember
from rlfleet.learner.group.session import GroupSession
from rlfleet.learner.output.publisher import Publisher
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.group import GroupAssignment
from rlfleet.shared.worker import WorkerAgent

from .helpers import (
    HTTP,
    REPO,
    TIMEOUT,
    get,
    ok,
    post,
    register,
    report,
    wait_for,
    wait_running,
    write_chunk,
)


def join(c, worker_id: str, generation=None, broken=None, store="127.0.0.1:1") -> dict:
    return ok(post(c, "/learner-group", {"worker_id": worker_id, "store_addr": store,
                                         "generation": generation, "broken": broken}))


def two_learners_and_data(c, task_sink) -> tuple[dict, dict]:
    col_sink = task_sink()
    col = register(c, "collector", col_sink)
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])
    for name in ("la", "lb"):
        register(c, "learner", task_sink(), worker_id=name)
    chunks = [(write_chunk(c, 100), 100) for _ in range(5)]
    ok(report(c, col["worker_id"], collect["task_id"], chunks))
    a = join(c, "la", store="127.0.0.1:2001")
    b = join(c, "lb", store="127.0.0.1:2002")
    return a, b


def sample(c, worker_id: str, generation: int, cursor: int) -> requests.Response:
    return post(c, "/sample", {"worker_id": worker_id, "batch_size": 64, "num_batches": 2,
                               "wait_s": 1.0, "group_generation": generation,
                               "group_cursor": cursor})


def test_ranks_get_disjoint_halves_of_the_same_group_batches(coordinator, task_sink):
    c = coordinator()
    a, b = two_learners_and_data(c, task_sink)
    assert (a["generation"], a["rank"], a["world_size"]) == (1, 0, 1)
    assert (b["generation"], b["rank"], b["world_size"], b["ranks"]) == (2, 1, 2, ["la", "lb"])
    assert b["store_addr"] == "127.0.0.1:2001" and b["epoch"] == a["epoch"]
    ra = ok(sample(c, "la", 2, 0))
    rb = ok(sample(c, "lb", 2, 0))
    assert ra["first_seq"] == rb["first_seq"] == 0 and ra["group_generation"] == 2
    assert ra["num_batches"] == rb["num_batches"] == 2

    def items(r: dict) -> list[set[int]]:
        (part,) = r["parts"]
        return [set(ids) for ids in part["item_ids"]]
    # batch k of each rank: 32 items, the ranks' halves together one batch of 64
    for ia, ib in zip(items(ra), items(rb), strict=True):
        assert len(ra["parts"][0]["rows"][0]) == 32
        assert len(ia | ib) <= 64
    # asking for the same cursor again (a lost answer) gives the same shard
    assert ok(sample(c, "la", 2, 0))["parts"] == ra["parts"]
    assert ok(sample(c, "la", 2, 2))["first_seq"] == 2
    assert get(c, "/status")["counters"]["granted_batches"] == 4  # sampled once per group


def test_requests_of_an_ended_generation_get_409_naming_the_field(coordinator, task_sink):
    c = coordinator()
    a, b = two_learners_and_data(c, task_sink)
    r = sample(c, "la", 1, 0)
    assert r.status_code == 409 and r.json()["field"] == "group_generation"
    r = sample(c, "la", 2, 1)  # not where an entry starts
    assert r.status_code == 409 and r.json()["field"] == "group_cursor"
    # a broken collective re-forms the group; the old generation's requests get 409
    again = join(c, "la", generation=2, broken="all-reduce timed out", store="127.0.0.1:2001")
    assert again["generation"] == 3 and again["ranks"] == ["la", "lb"]
    assert sample(c, "lb", 2, 0).status_code == 409
    hb = ok(post(c, "/workers/la/heartbeat", {"status": {}}))
    assert hb["group_generation"] == 3
    group = get(c, "/status")["learner_group"]
    assert group["reformations_by_reason"] == {"joined": 2, "collective failed": 1}
    assert group["last_reformation"]["reason"].startswith("collective failed: la")


def test_a_rank_that_does_not_answer_is_left_out_when_a_collective_fails(coordinator,
                                                                          task_sink):
    c = coordinator()
    col_sink = task_sink()
    register(c, "collector", col_sink)
    sinks = {name: task_sink() for name in ("la", "lb")}
    for name, sink in sinks.items():
        register(c, "learner", sink, worker_id=name)
    join(c, "la")
    join(c, "lb")
    # lb's process stops answering (killed, or hung): its sink is shut down
    sinks["lb"].close()
    g = get(c, "/status")["learner_group"]
    assert [r["worker_id"] for r in g["ranks"]] == ["la", "lb"]
    again = join(c, "la", generation=g["generation"], broken="connection closed by peer")
    assert again["ranks"] == ["la"] and again["world_size"] == 1
    group = get(c, "/status")["learner_group"]
    assert group["last_reformation"]["reason"] == "unresponsive: lb"


def test_bad_sync_requests_name_the_field(coordinator, task_sink):
    c = coordinator()
    col_sink = task_sink()
    col = register(c, "collector", col_sink)
    register(c, "learner", task_sink(), worker_id="la")
    cases = [({"worker_id": "la", "store_addr": "no port"}, "store_addr"),
             ({"worker_id": "la"}, "store_addr"),
             ({"worker_id": "la", "store_addr": "h:1", "generation": -1}, "generation"),
             ({"worker_id": "la", "store_addr": "h:1", "x": 1}, "x")]
    for body, field in cases:
        r = post(c, "/learner-group", body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
    r = post(c, "/learner-group", {"worker_id": "nobody", "store_addr": "h:1"})
    assert r.status_code == 404 and r.json()["field"] == "worker_id"
    r = post(c, "/learner-group", {"worker_id": col["worker_id"], "store_addr": "h:1"})
    assert r.status_code == 409 and "not a learner" in r.json()["error"]
    r = post(c, "/sample", {"worker_id": "la", "batch_size": 64, "num_batches": 1,
                            "group_generation": 1})
    assert r.status_code == 400 and "together" in r.json()["error"]
    assert get(c, "/status")["learner_group"]["generation"] == 0  # nothing changed


def test_the_group_shows_in_metrics_and_in_rlfleet_status(coordinator, task_sink):
    c = coordinator()
    two_learners_and_data(c, task_sink)
    ok(post(c, "/learn-info", {"worker_id": "la", "train_iterations": 10, "policy_version": 0,
                               "metrics": {"loss": 1.0}, "timers": {"allreduce_ms": 0.25}}))
    ok(post(c, "/learn-info", {"worker_id": "lb", "train_iterations": 10, "policy_version": 0,
                               "metrics": {"loss": 3.0}, "timers": {"allreduce_ms": 0.5}}))
    s = get(c, "/status")
    assert s["train"]["loss"] == 2.0  # averaged over the ranks
    assert s["metrics"]["train/loss"] == 2.0
    text = HTTP.get(c.url + "/metrics", timeout=TIMEOUT).text
    assert "rlfleet_learner_group_generation 2.0" in text
    assert "rlfleet_learner_group_world_size 2.0" in text
    assert 'rlfleet_learner_group_reformations_total{reason="joined"} 2.0' in text
    assert 'rlfleet_learner_allreduce_ms{rank="1",worker_id="lb"} 0.5' in text
    out = subprocess.run([sys.executable, "-m", "rlfleet", "status", "--coordinator",
                          c.url], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "learner group: generation 2, world size 2" in out.stdout
    assert "lb" in out.stdout and "0.50" in out.stdout


def test_a_rank_stuck_in_a_collective_asks_and_learns_its_generation_ended(coordinator,
                                                                          task_sink):
    """What a rank waiting for a frozen peer asks between slices of its wait: nothing while
    waits are short (lockstep ranks wait for each other all the time), then the coordinator,
    whose answer says when the generation has ended."""
    c = coordinator()
    sinks = {name: task_sink() for name in ("la", "lb")}
    agent = WorkerAgent(c.url, Role.LEARNER, sinks["la"].url, "la").start()
    agent.wait_registered(10)
    register(c, "learner", sinks["lb"], worker_id="lb")
    session = GroupSession(agent, Publisher(threading.Event()), threading.Event())
    member = GroupMember("127.0.0.1", timeout_s=5)
    try:
        session.open(member)
        assert member.ended == session.generation_ended
        join(c, "la", store=member.store_addr)
        generation = join(c, "lb")["generation"]
        session.assignment = GroupAssignment(**join(c, "la", generation=generation,
                                                    store=member.store_addr))
        assert (session.assignment.rank, session.assignment.world_size) == (0, 2)
        asked = len(get(c, "/status")["learner_group"]["history"])
        assert not session.generation_ended(0.5)  # a short wait: nothing asked
        assert not session.generation_ended(1.5)  # asked: the generation goes on
        assert len(get(c, "/status")["learner_group"]["history"]) == asked  # unchanged
        ok(HTTP.delete(c.api("/workers/lb"), timeout=TIMEOUT))  # lb is gone
        wait_for(lambda: session.generation_ended(2.0), timeout_s=5,
                 what="the ended generation seen")
    finally:
        member.close()
        agent.close()
