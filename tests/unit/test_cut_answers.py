"""Answers cut off part-way: what a worker sees when the coordinator is SIGKILLed between
writing an answer's headers and its body (its HTTP server writes the two separately).

A collector waiting for a permit can get an answer's headers and then EOF, and `requests`
raises `ChunkedEncodingError` for it; let through, that would end the collector's loop (which
rides out `HttpError`) and its process with exit 1, and the launcher would restart a collector
nobody killed. What must hold: a cut answer is a connection failure like a refused one
(retried, then `HttpError`), and a collector waiting for a permit or reporting chunks rides it
out.

The coordinator is a real one; between it and the client sits a TCP proxy on loopback that
passes everything, or cuts answers after their headers and the body's first byte.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

import numpy as np
import pytest

from rlfleet.collector.adder import StorageAdder
from rlfleet.collector.collecting import wait_for_permit
from rlfleet.collector.service import CollectorService
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import wait_for, wait_running


class CuttingProxy:
    """Forwards connections to `upstream` (host, port); while `cut_left` > 0, an answer's
    headers and the first byte of its body go through, then both connections close (the
    coordinator died mid-answer) and `cut_left` goes down by one."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.cut_left = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, name="cutting-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _answers(self, upstream: socket.socket, client: socket.socket) -> None:
        held = b""
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                with self._lock:
                    cutting = self.cut_left > 0
                if not cutting:
                    client.sendall(data)
                    continue
                held += data
                end = held.find(b"\r\n\r\n")
                if end < 0 or len(held) < end + 5:  # the headers and a byte of body
                    continue
                client.sendall(held[:end + 5])
                with self._lock:
                    self.cut_left -= 1
                    self.cuts += 1
                break
        for s in (client, upstream):  # shutdown: the pump's recv holds the socket open
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
def proxied(coordinator):
    c = coordinator()
    host, port = c.url.removeprefix("http://").rsplit(":", 1)
    proxy = CuttingProxy((host, int(port)))
    try:
        yield c, proxy
    finally:
        proxy.close()


def _arrays(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.integers(0, 2, n).astype(np.int64),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def test_a_cut_answer_is_retried_and_then_an_http_error(proxied):
    c, proxy = proxied
    client = HttpClient(proxy.url, timeout_s=5, retries=2, backoff_s=0.01)
    try:
        proxy.cut_left = 1
        status = client.get(f"{API}/status")  # the retry gets the whole answer
        assert proxy.cuts == 1 and "counters" in status
        proxy.cut_left = 10**6
        with pytest.raises(HttpError) as raised:
            client.get(f"{API}/status")
        assert raised.value.status is None  # unreachable, not an answer
        assert "IncompleteRead" in str(raised.value)  # the body fell short of its length
        assert proxy.cuts == 4  # every attempt was cut
    finally:
        client.close()


def test_a_collector_rides_out_cut_answers_to_permits_and_reports(
        proxied, task_sink, caplog: pytest.LogCaptureFixture):
    c, proxy = proxied
    sink = task_sink()
    service = CollectorService(proxy.url, sink.url)  # its loop is not started: driven here
    adder = None
    try:
        service.agent._register(retries=0)
        worker_id = service.agent.worker_id
        task_id = sink.wait_task("collect")["task_id"]
        wait_running(c, task_id)
        store = DirectoryStorage(c.storage_dir)
        adder = StorageAdder(store, service.agent.client, lambda: worker_id, lambda: task_id,
                             report_interval_s=0.02)
        adder.throttle.set()  # as the coordinator's answer sets it when the learner lags
        proxy.cut_left = 10**6
        with caplog.at_level(logging.WARNING, logger="rlfleet.collector"):
            # no answer: not a crash
            assert wait_for_permit(service.agent, adder, threading.Event()) is False
            assert "permit request failed" in caplog.text
            adder.add(_arrays(8), -1, [8.0], [8])
            wait_for(lambda: "could not report 1 chunks" in caplog.text, timeout_s=10,
                     what="a cut report")
        proxy.cut_left = 0
        assert adder.flush(timeout=10), "the reporter died of a cut answer"
        assert adder.chunks_reported == 1
        assert c.status()["counters"]["chunks_accepted"] == 1
        adder.throttle.set()
        # nothing lags: granted
        assert wait_for_permit(service.agent, adder, threading.Event()) is True
    finally:
        if adder is not None:
            adder.close(timeout=2)
        service.close()
        sink.close()

