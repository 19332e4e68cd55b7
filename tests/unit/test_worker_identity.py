"""One worker id, one process: registrations and heartbeats under an id, against a real
coordinator process, with real HTTP servers on loopback as the workers.

Registering again from the same URL is a restart and replaces the entry. From another URL,
the id is refused (409 naming `worker_id` and the holder's URL) while its holder heartbeats
and answers, or only hangs; it is taken over when nothing listens at the holder's URL any
more (a restart on another port) or once the holder is silent past the heartbeat timeout,
and then the old holder's next heartbeat is answered 409 (superseded).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from .helpers import HTTP, TIMEOUT, get, ok, post, prewarm_module, register, wait_for

DEFAULT: dict = {}  # heartbeat_timeout_s: 60, longer than any of these tests
SHORT_TIMEOUT = {"coordinator": {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.0,
                                 "task_push_timeout_s": 2.0, "snapshot_interval_s": 0.3}}
BOOTS = {
    "test_registering_again_from_the_same_url_is_a_restart": DEFAULT,
    "test_a_twin_from_another_url_is_refused_while_the_holder_lives": DEFAULT,
    "test_a_holder_that_is_gone_is_replaced_and_its_heartbeat_superseded": DEFAULT,
    "test_a_holder_silent_past_the_heartbeat_timeout_is_replaced_from_any_url": SHORT_TIMEOUT,
}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, BOOTS)


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A URL where a socket listens but nothing ever answers: a frozen (SIGSTOPped) worker,
    whose kernel still completes the TCP handshake."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _register(c, url: str, worker_id: str, role: str = "learner"):
    return post(c, "/workers", {"role": role, "url": url, "worker_id": worker_id})


def _heartbeat(c, worker_id: str, url: str | None = None):
    body = {"status": {"train_iterations": 1.0}}
    if url is not None:
        body["url"] = url
    return post(c, f"/workers/{worker_id}/heartbeat", body)


def test_registering_again_from_the_same_url_is_a_restart(coordinator, task_sink):
    c = coordinator()
    sink = task_sink()
    register(c, "collector", sink, worker_id="col-1")
    first = sink.wait_task("collect")
    again = register(c, "collector", sink, worker_id="col-1")
    assert again["worker_id"] == "col-1"
    wait_for(lambda: len(sink.tasks("collect")) == 2, what="the task pushed again")
    assert sink.tasks("collect")[-1]["task_id"] == first["task_id"]
    workers = get(c, "/workers")["workers"]
    assert [(w["worker_id"], w["url"], w["registrations"]) for w in workers] == [
        ("col-1", sink.url, 2)]


def test_a_twin_from_another_url_is_refused_while_the_holder_lives(coordinator, task_sink,
                                                                   hung_url):
    c = coordinator()
    holder, twin = task_sink(), task_sink()
    register(c, "learner", holder, worker_id="l1")
    holder.wait_task("learn")

    r = _register(c, twin.url, "l1")
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["field"] == "worker_id" and body["holder_url"] == holder.url
    assert "worker_id='l1'" in body["error"] and holder.url in body["error"]
    # nothing changed: one worker, the holder's, registered once; the twin got no task
    w = get(c, "/workers/l1")
    assert (w["url"], w["registrations"], w["state"]) == (holder.url, 1, "alive")
    assert twin.tasks() == []
    assert ok(_heartbeat(c, "l1", holder.url))["stop"] is False
    # a heartbeat naming the twin's URL is not the holder's
    r = _heartbeat(c, "l1", twin.url)
    assert r.status_code == 409 and r.json()["holder_url"] == holder.url

    # a holder that hangs (its socket listens, nothing answers) keeps its id too: within
    # its heartbeat timeout, the coordinator cannot tell it from a slow one
    assert _register(c, hung_url, "l2").status_code == 200
    t0 = time.monotonic()
    r = _register(c, twin.url, "l2")
    assert r.status_code == 409 and r.json()["holder_url"] == hung_url, r.text
    assert time.monotonic() - t0 < TIMEOUT


def test_a_holder_that_is_gone_is_replaced_and_its_heartbeat_superseded(coordinator,
                                                                        task_sink):
    """The old process died and a new one registers from another port (how `rlfleet up`
    restarts a worker) before the old entry's heartbeat timeout: nothing answers at the old
    URL, so the new one is the restart, and takes the worker's task back."""
    c = coordinator()
    old, new = task_sink(), task_sink()
    register(c, "collector", old, worker_id="c1")
    task = old.wait_task("collect")
    old.close()
    again = ok(_register(c, new.url, "c1", role="collector"))
    assert again["worker_id"] == "c1"
    assert new.wait_task("collect")["task_id"] == task["task_id"]
    w = get(c, "/workers/c1")
    assert (w["url"], w["registrations"]) == (new.url, 2)
    # were the old process only frozen, it must stop when it wakes, not live on beside it
    r = _heartbeat(c, "c1", old.url)
    assert r.status_code == 409, r.text
    assert r.json()["holder_url"] == new.url and "superseded" in r.json()["error"]
    assert ok(_heartbeat(c, "c1", new.url))["stop"] is False
    assert ok(_heartbeat(c, "c1"))["stop"] is False  # a heartbeat without a URL: unchecked


def test_a_holder_silent_past_the_heartbeat_timeout_is_replaced_from_any_url(coordinator,
                                                                             task_sink):
    c = coordinator(**SHORT_TIMEOUT)
    holder, newcomer = task_sink(), task_sink()  # the holder answers /health, but is silent
    register(c, "learner", holder, worker_id="l1")
    assert _register(c, newcomer.url, "l1").status_code == 409
    # the scheduler declares it dead when the timeout passes; a registration at any time
    # after the timeout takes the id, declared or not
    wait_for(lambda: _register(c, newcomer.url, "l1").status_code == 200, timeout_s=10,
             interval_s=0.1,
             what="the id free once its holder was silent past heartbeat_timeout_s=1")
    w = get(c, "/workers/l1")
    assert (w["url"], w["state"]) == (newcomer.url, "alive")
    r = HTTP.post(c.api("/workers/l1/heartbeat"), json={"url": holder.url}, timeout=TIMEOUT)
    assert r.status_code == 409 and r.json()["holder_url"] == newcomer.url
