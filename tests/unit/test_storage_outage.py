"""Storage outages: a Redis server of the test's own is SIGKILLed and restarted on its port.

What must hold: a Redis call rides out an outage shorter than its retry window and
fails with `StorageError` (promptly, not a hang) after a longer one; journal records survive a
server crash (`appendfsync always`); the collector's adder holds chunks while storage is down,
pauses collection at `max_held_chunks`, and writes then announces all of them once storage is
back; the collector's policy check fails with `StorageError`, which the service rides out.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from redis_server import RedisServer

from rlfleet.collector.adder import StorageAdder
from rlfleet.collector.service import CollectorService
from rlfleet.collector.weights import StorageWeightSource
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.codec import decode_arrays, encode_weights
from rlfleet.shared.envs.make import env_spec
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.infra.storage import RedisStorage, StorageError
from rlfleet.shared.infra.storage.directory import DirectoryStorage
from rlfleet.shared.run.config import parse_config

from .helpers import closed_port, make_config, register, wait_for, wait_running


def store_on(server: RedisServer, retry_s: float) -> RedisStorage:
    return RedisStorage(server.url, namespace=f"outage-{uuid.uuid4().hex}", retry_s=retry_s)


def run_in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run `fn` on a thread; the dict gets its "result" or "error"."""
    out: dict = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as err:  # handed to the test, which asserts on it
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


# -- RedisStorage ---------------------------------------------------------------------------

def test_a_write_during_an_outage_completes_when_redis_returns(redis_server: RedisServer):
    store = store_on(redis_server, retry_s=8)
    try:
        store.put_chunks({"before": b"0"})  # a pooled connection, which the kill leaves stale
        redis_server.kill()
        failed = store.retry.failures
        thread, out = run_in_thread(lambda: store.put_chunks({"during-1": b"1",
                                                              "during-2": b"2"}))
        wait_for(lambda: store.retry.failures >= failed + 2, timeout_s=5,
                 what="the write to fail against the dead server, twice")
        assert thread.is_alive()  # still retrying
        redis_server.start()
        thread.join(timeout=10)
        assert not thread.is_alive() and "error" not in out, out
        assert store.get_chunks(["during-1", "during-2"]) == [b"1", b"2"]
        assert store.list_chunks() == ["before", "during-1", "during-2"]
    finally:
        store.close()


@pytest.mark.parametrize("call", [
    lambda s: s.put_chunks({"a": b"1"}),
    lambda s: s.get_chunks(["a"]),
    lambda s: s.append_journal(0, [b"r"]),
    lambda s: s.put_weights(1, b"w"),
], ids=["put_chunks", "get_chunks", "append_journal", "put_weights"])
def test_an_outage_longer_than_the_window_raises_storage_error(redis_server: RedisServer,
                                                                call):
    retry_s = 0.5
    store = store_on(redis_server, retry_s=retry_s)
    try:
        store.put_chunks({"warm": b"x"})
        redis_server.kill()
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=redis_server.url):
            call(store)
        elapsed = time.monotonic() - t0
    finally:
        store.close()
    assert retry_s * 0.9 <= elapsed < retry_s + 3, f"gave up after {elapsed:.2f}s"


def test_a_wrong_password_fails_at_once_not_after_the_window(tmp_path: Path):
    server = RedisServer(tmp_path, password="right")
    server.start()
    store = RedisStorage(f"redis://:wrong@127.0.0.1:{server.port}/0", "auth", retry_s=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="invalid username-password"):
            store.list_chunks()
        assert time.monotonic() - t0 < 2
    finally:
        store.close()
        server.close()


def test_journal_records_survive_a_redis_crash(redis_server: RedisServer):
    store = store_on(redis_server, retry_s=5)
    try:
        store.append_journal(7, [b"first", b"\x00second\xff"])
        store.append_journal(8, [b"third"])
        redis_server.kill()
        redis_server.start()
        assert store.journal_generations() == [7, 8]
        assert store.read_journal(7) == [b"first", b"\x00second\xff"]
        assert store.read_journal(8) == [b"third"]
    finally:
        store.close()


def test_open_storage_reads_the_retry_window_from_the_environment(monkeypatch):
    from rlfleet.shared.infra.storage import open_storage

    monkeypatch.setenv("RLFLEET_STORAGE_RETRY_S", "0.25")
    store = open_storage(f"redis://127.0.0.1:{closed_port()}/0", "env")
    assert isinstance(store, RedisStorage) and store.retry.window_s == 0.25
    store.close()
    monkeypatch.setenv("RLFLEET_STORAGE_RETRY_S", "soon")
    with pytest.raises(ValueError, match="RLFLEET_STORAGE_RETRY_S"):
        open_storage("redis://127.0.0.1:6379/0", "env")


# -- the collector --------------------------------------------------------------------------

def _arrays(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.integers(0, 2, n).astype(np.int64),
            "reward": np.full(n, seed, np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def test_the_adder_holds_chunks_while_redis_is_down(redis_server: RedisServer, coordinator,
                                                     task_sink):
    c = coordinator()
    sink = task_sink()
    worker_id = register(c, "collector", sink)["worker_id"]
    task_id = sink.wait_task("collect")["task_id"]
    wait_running(c, task_id)
    store = store_on(redis_server, retry_s=0.2)
    client = HttpClient(c.url, timeout_s=5, retries=2)
    adder = StorageAdder(store, client, lambda: worker_id, lambda: task_id,
                         report_interval_s=0.02, max_held_chunks=3)
    total = 6
    added: list[str] = []
    try:
        # While Redis is up, add() writes before it returns.
        added.append(adder.add(_arrays(8, 0), -1, [0.0], [8]))
        assert adder.chunks_written == 1 and adder.chunks_held == 0
        assert store.list_chunks() == added
        redis_server.kill()

        def collect() -> None:
            for i in range(1, total):
                added.append(adder.add(_arrays(8, i), -1, [float(i)], [8]))

        thread, out = run_in_thread(collect)
        wait_for(lambda: len(added) == 4 and adder.chunks_held == 3, timeout_s=5,
                 what="three chunks held")
        # Blocked on the 4th: the writer keeps failing meanwhile, and add() does not return.
        failures = adder.write_failures
        wait_for(lambda: adder.write_failures >= failures + 2, timeout_s=5,
                 what="two more failed writes")
        assert len(added) == 4 and adder.chunks_held == 3 and thread.is_alive()
        assert adder.chunks_written == 1

        redis_server.start()
        thread.join(timeout=10)
        assert not thread.is_alive() and "error" not in out, out
        wait_for(lambda: adder.chunks_reported == total, timeout_s=10,
                 what="every chunk announced")
        assert adder.flush(timeout=5)
        assert adder.chunks_held == 0 and adder.chunks_written == total
        assert c.status()["counters"]["chunks_accepted"] == total
        for i, blob in enumerate(store.get_chunks(added)):
            arrays, meta = decode_arrays(blob)
            assert arrays["reward"].tolist() == [float(i)] * 8
            assert meta["worker_id"] == worker_id
        assert adder.close(timeout=5)
    finally:
        adder.close(timeout=1)
        client.close()
        store.close()


def test_closing_the_adder_during_an_outage_reports_what_was_never_written(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture):
    store = store_on(redis_server, retry_s=0.05)
    client = HttpClient(f"http://127.0.0.1:{closed_port()}", timeout_s=1, retries=0)
    adder = StorageAdder(store, client, lambda: "collector-x", lambda: None,
                         max_held_chunks=4)
    try:
        redis_server.kill()
        for i in range(2):
            adder.add(_arrays(4, i), -1, [], [])
        assert adder.chunks_held == 2 and adder.write_failures >= 1
        with caplog.at_level(logging.WARNING, logger="rlfleet.collector"):
            assert adder.close(timeout=0.3) is False
        assert "2 chunks never written" in caplog.text
        # Only one warning for the outage itself, however many writes failed.
        assert caplog.text.count("storage write failed") == 1
    finally:
        client.close()
        store.close()


def test_a_halted_adder_stops_waiting_for_room(redis_server: RedisServer):
    store = store_on(redis_server, retry_s=0.05)
    client = HttpClient(f"http://127.0.0.1:{closed_port()}", timeout_s=1, retries=0)
    adder = StorageAdder(store, client, lambda: "collector-x", lambda: None,
                         max_held_chunks=1)
    try:
        redis_server.kill()
        adder.add(_arrays(4, 0), -1, [], [])
        thread, out = run_in_thread(lambda: adder.add(_arrays(4, 1), -1, [], []))
        failures = adder.write_failures
        wait_for(lambda: adder.write_failures > failures, timeout_s=5,
                 what="the writer to fail again")
        assert thread.is_alive()  # waiting for room
        adder.halt()  # what the service does when it closes
        thread.join(timeout=5)
        assert not thread.is_alive() and "error" not in out, out
        assert adder.chunks_held == 2
    finally:
        adder.close(timeout=0.2)
        client.close()
        store.close()


def test_the_policy_check_raises_storage_error_while_redis_is_down(redis_server: RedisServer):
    store = store_on(redis_server, retry_s=0.1)
    try:
        redis_server.kill()
        with pytest.raises(StorageError):
            StorageWeightSource(store).poll(-1)
    finally:
        store.close()


def test_the_collector_service_rides_out_a_failed_policy_check(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture):
    cfg = parse_config(make_config())
    policy = make_policy(cfg.algo, env_spec(cfg.env), 0)
    store = store_on(redis_server, retry_s=0.05)
    weights = StorageWeightSource(store)
    nowhere = f"http://127.0.0.1:{closed_port()}"
    service = CollectorService(nowhere, nowhere)  # never started: no registration
    try:
        redis_server.kill()
        with caplog.at_level(logging.INFO, logger="rlfleet.collector"):
            for _ in range(3):
                service.refresher.refresh(policy, weights, force=True)
            assert policy.version < 0
            assert caplog.text.count("cannot check for a newer policy") == 1
            redis_server.start()
            store.put_weights(1, encode_weights(policy.policy_state(),
                                                {"policy_version": "1"}))
            service.refresher.refresh(policy, weights, force=True)
        assert policy.version == 1 and service.counters.policy_version == 1
        assert "policy checks resume" in caplog.text
        status = service.status()
        assert status["chunks_held"] == 0 and status["write_failures"] == 0
        assert service.heartbeat_status()["chunks_held"] == 0.0
    finally:
        service.close()
        store.close()


class _FlakyDirectory(DirectoryStorage):
    """A real directory whose next chunk writes fail as scripted (an exception each)."""

    def __init__(self, root: Path, failures: list[Exception]) -> None:
        super().__init__(root)
        self.failures = failures

    def put_chunk(self, chunk_id: str, blob: bytes) -> None:
        if self.failures:
            raise self.failures.pop(0)
        super().put_chunk(chunk_id, blob)


def test_the_adder_writer_outlives_an_unexpected_error(tmp_path: Path, coordinator, task_sink,
                                                        caplog: pytest.LogCaptureFixture):
    """Only `StorageError` is expected of storage; anything else (a bug, a driver's own
    error) must not end the thread that writes held chunks: collection would stall for good,
    with the collector still heartbeating, so nothing would restart it."""
    c = coordinator()
    sink = task_sink()
    worker_id = register(c, "collector", sink)["worker_id"]
    task_id = sink.wait_task("collect")["task_id"]
    wait_running(c, task_id)
    store = _FlakyDirectory(tmp_path / "store", [StorageError("down"), RuntimeError("bug"),
                                                 RuntimeError("bug again")])
    client = HttpClient(c.url, timeout_s=5, retries=2)
    adder = StorageAdder(store, client, lambda: worker_id, lambda: task_id,
                         report_interval_s=0.02, max_held_chunks=4)
    try:
        with caplog.at_level(logging.ERROR, logger="rlfleet.collector"):
            added = [adder.add(_arrays(4, i), -1, [], []) for i in range(3)]
            wait_for(lambda: adder.chunks_reported == 3, timeout_s=10,
                     what="every chunk written and announced")
        assert set(store.list_chunks()) == set(added)
        assert adder.write_failures == 3 and not store.failures
        assert c.status()["counters"]["chunks_accepted"] == 3
        assert caplog.text.count("writing a held chunk failed unexpectedly") == 1
        assert adder.close(timeout=5)
    finally:
        adder.close(timeout=1)
        client.close()
