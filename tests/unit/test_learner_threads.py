"""The learner's publish and report threads: versions in order and without gaps through
bursts, conflicts and outages; reports off the training thread, with the coordinator's
answers kept for it."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlfleet.learner.output.publisher import PublishConflict, Publisher
from rlfleet.learner.output.reporter import Reporter
from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.contract.wire.sampling import LearnInfo, PriorityUpdate
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.infra.storage.directory import DirectoryStorage

from .helpers import closed_port, collector_and_learner, ok, post, wait_for
from .test_storage_outage import store_on


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), value), "b": torch.full((4,), value)}


def test_versions_go_out_in_order_and_the_newest_state_wins(tmp_path):
    store = DirectoryStorage(tmp_path / "s")
    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    try:
        for i in range(200):  # far faster than one write each
            publisher.submit(_state(float(i)), train_iterations=i)
        assert publisher.flush(timeout_s=10)
        latest = store.latest_version()
        assert latest == publisher.version == publisher.written - 1
        assert publisher.written + publisher.superseded == 200
        tensors, meta = decode_weights(store.get_weights()[1])
        assert torch.equal(tensors["w"], _state(199.0)["w"])  # the last state handed over
        assert meta == {"policy_version": str(latest), "train_iterations": "199"}
        for v in range(max(0, latest - store.keep_weight_versions + 1), latest + 1):
            assert int(decode_weights(store.get_weights(v)[1])[1]["policy_version"]) == v
    finally:
        publisher.close()


def test_a_version_is_due_only_once_the_minimum_interval_has_passed(tmp_path):
    store = DirectoryStorage(tmp_path / "s")
    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    try:
        assert publisher.due(3600.0)  # nothing handed over yet: the first version is due
        publisher.submit(_state(0.0), 0)
        assert not publisher.due(3600.0)
        assert publisher.due(0.0)     # 0: every publish_every, no interval
        submitted = time.monotonic()
        wait_for(lambda: publisher.due(0.05), timeout_s=5, what="the interval to pass")
        assert time.monotonic() - submitted >= 0.05
        assert publisher.flush(timeout_s=10) and store.latest_version() == 0
    finally:
        publisher.close()


def test_a_version_another_learner_took_makes_this_one_stop_publishing(tmp_path):
    store = DirectoryStorage(tmp_path / "s")
    publisher = Publisher(threading.Event())
    publisher.attach(store, 4)  # believes 4 is the latest...
    store.put_weights(5, encode_weights(_state(-1.0), {"policy_version": "5"}))  # ...but not
    try:
        publisher.submit(_state(1.0), 10)
        with pytest.raises(PublishConflict, match="not the publisher"):
            publisher.flush(timeout_s=10)
        assert publisher.version == 4
        assert decode_weights(store.get_weights(5)[1])[0]["w"][0, 0] == -1.0
        publisher.attach(store, 5)  # a new generation: it may publish again
        publisher.submit(_state(2.0), 11)
        assert publisher.flush(timeout_s=10) and store.latest_version() == 6
    finally:
        publisher.close()


def test_an_outage_holds_the_version_and_the_newest_state_goes_out_after(redis_server):
    store = store_on(redis_server, retry_s=0.05)
    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    try:
        publisher.submit(_state(0.0), 0)
        assert publisher.flush(timeout_s=10) and publisher.version == 0
        redis_server.kill()
        publisher.submit(_state(1.0), 1)
        assert not publisher.flush(timeout_s=1.0)  # still retrying
        publisher.submit(_state(2.0), 2)           # replaces the state that waits
        redis_server.start()
        assert publisher.flush(timeout_s=20)
        assert publisher.version == 1  # one version, the newest state, no gap
        tensors, meta = decode_weights(store.get_weights(1)[1])
        assert meta["train_iterations"] == "2" and tensors["w"][0, 0] == 2.0
    finally:
        publisher.close()
        store.close()


def test_closing_during_an_outage_gives_up_the_pending_version(redis_server):
    closing = threading.Event()
    store = store_on(redis_server, retry_s=0.05)
    publisher = Publisher(closing)
    publisher.attach(store, -1)
    try:
        redis_server.kill()
        publisher.submit(_state(1.0), 1)
        closing.set()
        assert not publisher.flush(timeout_s=10)
        publisher.close(timeout_s=5)
        assert publisher.version == -1
    finally:
        store.close()


def _info(worker_id: str, iterations: int, version: int = -1) -> LearnInfo:
    return LearnInfo(worker_id=worker_id, train_iterations=iterations, policy_version=version,
                     metrics={"train/loss": 0.25},
                     priorities=[PriorityUpdate(buffer="replay", item_ids=[], priorities=[])])


def test_reports_reach_the_coordinator_one_at_a_time(coordinator, task_sink):
    c = coordinator()
    _, _, learner, _ = collector_and_learner(c, task_sink)
    client = HttpClient(c.url, timeout_s=5, retries=0)
    reporter = Reporter(client)
    built_on: list[str] = []
    try:
        assert reporter.due(0.0)

        def build() -> LearnInfo:
            built_on.append(threading.current_thread().name)
            return _info(learner["worker_id"], 7)

        reporter.send(build)
        assert not reporter.due(0.0) or reporter.sent == 1  # pending or in flight, or done
        reporter.flush()
        assert reporter.sent == 1 and built_on == ["report"]
        assert c.status()["counters"]["train_iterations"] == 7
        assert not reporter.due(60.0)  # the next one is due an interval after this one ended
        assert not reporter.stop_run.is_set()
        ok(post(c, "/run/stop", {}))
        reporter.send(lambda: _info(learner["worker_id"], 8))
        reporter.flush()
        assert reporter.stop_run.is_set()  # for the training thread to act on
    finally:
        reporter.close()
        client.close()


def test_a_lost_report_is_counted_and_the_next_one_goes_out():
    client = HttpClient(f"http://127.0.0.1:{closed_port()}", timeout_s=1, retries=0)
    reporter = Reporter(client)
    try:
        reporter.send(lambda: _info("learner-x", 1))
        reporter.flush()
        assert reporter.failed == 1 and reporter.sent == 0
        wait_for(lambda: reporter.due(0.0), what="the reporter idle again")
    finally:
        reporter.close()
        client.close()


def test_storage_url_opens_for_the_publisher(tmp_path):
    """The publisher writes through the same storage API the learner opens."""
    store = open_storage(str(tmp_path / "s"), "run")
    publisher = Publisher(threading.Event())
    publisher.attach(store, store.latest_version() or -1)
    try:
        publisher.submit(_state(3.0), 3)
        assert publisher.flush(timeout_s=10) and store.latest_version() == 0
    finally:
        publisher.close()
        store.close()
