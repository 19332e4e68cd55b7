"""services/serve.py's in-process server: a worker role's app served by a thread pool of the
role's own process, over real HTTP on loopback. What a worker's server must give it holds:
the token guard and the JSON body limit (also for a chunked body), the service started with
the server and closed after it, a fatal error in the role's loop ending the process (exit 1),
a stop request ending it cleanly (exit 0); and `rlfleet collector` is one process that
SIGTERM ends with code 0. What cheroot answers itself (a malformed request, a request line or
headers over the limit, an HTTP version it does not speak, a timeout) is JSON like the app's
errors, and normal requests on the same server are not affected."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from rlfleet.http_errors import MAX_HEADER_BYTES
from rlfleet.serve import InProcessServer
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.tasks import TaskAccepted, TaskEnvelope
from rlfleet.shared.worker import WorkerService, create_worker_app

from .helpers import closed_port, descendants, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token"
LIMIT = 4096


class Recorder(WorkerService):
    """A worker role whose loop is a thread that fails when told to."""

    role = Role.COLLECTOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []
        self.die = threading.Event()
        self._loop = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.die.wait()
        self.fail()

    def start(self) -> Recorder:
        self.events.append("start")
        self._loop.start()
        return super().start()

    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        self.events.append(f"task {envelope.task.task_id}")
        return TaskAccepted(task_id=envelope.task.task_id, accepted=True)

    def status(self) -> dict[str, Any]:
        return {"events": list(self.events)}

    def close(self) -> None:
        self.events.append("close")
        super().close()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch):
    """A Recorder behind the in-process server with a token and a small body limit; the
    coordinator it names is a closed port (its agent just keeps trying)."""
    monkeypatch.setenv("RLFLEET_TOKEN", TOKEN)
    monkeypatch.delenv("RLFLEET_TOKEN_FILE", raising=False)
    monkeypatch.setenv("RLFLEET_MAX_BODY_BYTES", str(LIMIT))
    port = free_port()
    service = Recorder(f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{port}")
    server = InProcessServer(create_worker_app(service), "127.0.0.1", port).listen()
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(server.run(install_signals=False)),
                              daemon=True)
    runner.start()
    wait_for(lambda: "start" in service.events, 10)
    yield server, service, f"http://127.0.0.1:{port}", runner, codes
    server.request_stop()
    runner.join(timeout=30)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_health_is_open_and_everything_else_needs_the_token(served):
    _, _, url, _, _ = served
    r = requests.get(f"{url}/health", timeout=5)
    assert r.status_code == 200 and r.json() == {"ok": True, "role": "collector"}
    r = requests.get(f"{url}/status", timeout=5)
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
    r = requests.get(f"{url}/status", headers=auth(), timeout=5)
    assert r.status_code == 200 and r.json()["events"] == ["start"]


def test_bodies_over_the_limit_get_a_json_413_also_when_chunked(served):
    _, service, url, _, _ = served
    body = b" " * (LIMIT + 1)
    r = requests.post(f"{url}/task", data=body, timeout=5,
                      headers={**auth(), "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {"error": f"request body is {LIMIT + 1} bytes; the limit is {LIMIT}",
                        "field": None}

    def chunked():
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = requests.post(f"{url}/task", data=chunked(), timeout=5,
                      headers={**auth(), "Content-Type": "application/json"})
    assert r.request.headers.get("Transfer-Encoding") == "chunked"
    assert r.status_code == 413
    assert r.json()["error"] == f"request body is more than {LIMIT} bytes; the limit is {LIMIT}"
    assert service.events == ["start"], "nothing was accepted"


def raw_exchange(url: str, request: bytes, sock: socket.socket | None = None,
                 ) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as bytes over a socket (a new one unless given) and read one answer:
    its status, headers (lower-case names) and body (by Content-Length, else to the close)."""
    own = sock is None
    if sock is None:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            assert more, f"connection closed before a whole answer: {data!r}"
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("iso-8859-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines)}
        if "content-length" in headers:
            while len(body) < int(headers["content-length"]):
                more = sock.recv(65536)
                assert more, "connection closed inside the body"
                body += more
        else:
            while more := sock.recv(65536):
                body += more
        return int(status_line.split()[1]), headers, body
    finally:
        if own:
            sock.close()


BIG = MAX_HEADER_BYTES + 1000


@pytest.mark.parametrize("request_bytes, status, says", [
    (b"hello\r\n\r\n", 400, "Bad Request: Malformed Request-Line"),
    (b"GET /health NOT-HTTP\r\n\r\n", 400, "Malformed Request-Line: bad protocol"),
    (b"get /health HTTP/1.1\r\n\r\n", 400, "Malformed method name"),
    (b"GET /health HTTP/1.1\n\n", 400, "HTTP requires CRLF terminators"),
    (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", 400, "Illegal header line"),
    (b"GET /" + b"a" * BIG + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
     f"URI Too Long: the request line is over {MAX_HEADER_BYTES} bytes"),
    (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505,
     "HTTP Version Not Supported: this server speaks HTTP/1.0 and HTTP/1.1"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * BIG + b"\r\n\r\n", 431,
     f"Request Header Fields Too Large: the request line and headers are over "
     f"{MAX_HEADER_BYTES} bytes"),
    (b"POST /task HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
     "the only Transfer-Encoding understood is chunked"),
], ids=["garbage", "bad-protocol", "lower-case-method", "bare-lf", "bad-header", "uri-too-long",
        "http-2", "headers-too-large", "transfer-encoding"])
def test_the_servers_own_errors_are_json_and_close(served, request_bytes: bytes, status: int,
                                                   says: str):
    _, service, url, _, _ = served
    code, headers, body = raw_exchange(url, request_bytes)
    assert code == status
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    answer = json.loads(body)
    assert set(answer) == {"error", "field"} and answer["field"] is None
    assert says in answer["error"]
    # the server goes on answering normally
    r = requests.get(f"{url}/health", timeout=5)
    assert r.status_code == 200 and r.json() == {"ok": True, "role": "collector"}
    assert service.events == ["start"]


def test_a_request_that_does_not_arrive_in_time_gets_a_json_408(served):
    server, _, url, _, _ = served
    server.server.timeout = 1  # applies to connections accepted from now on
    code, headers, body = raw_exchange(url, b"GET /hea")
    assert (code, headers["content-type"], headers["connection"]) == (
        408, "application/json", "close")
    assert json.loads(body) == {
        "error": "Request Timeout: the request did not arrive within 1 s", "field": None}


def test_keep_alive_and_headers_under_the_limit_are_unaffected(served):
    _, _, url, _, _ = served
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(3):  # one connection, three requests
            code, headers, body = raw_exchange(
                url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * 30000
                + b"\r\n\r\n", sock)
            assert code == 200 and "close" not in headers.get("connection", "")
            assert json.loads(body) == {"ok": True, "role": "collector"}
    r = requests.get(f"{url}/status", params={"q": "x" * 30000}, headers=auth(), timeout=5)
    assert r.status_code == 200 and r.json()["events"] == ["start"]


def test_a_stop_request_stops_serving_then_closes_the_service_and_exits_0(served):
    server, service, url, runner, codes = served
    server.request_stop()
    runner.join(timeout=30)
    assert codes == [0]
    assert service.events == ["start", "close"]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/health", timeout=2)


def test_a_fatal_error_in_the_roles_loop_ends_the_process_with_1(served):
    _, service, _, runner, codes = served
    service.die.set()
    runner.join(timeout=30)
    assert codes == [1]
    assert service.events[-1] == "close"


def test_a_port_in_use_is_a_config_error_naming_it():
    port = free_port()
    holder = InProcessServer(create_worker_app(Recorder("http://127.0.0.1:9", "x")),
                             "127.0.0.1", port).listen()
    try:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            InProcessServer(create_worker_app(Recorder("http://127.0.0.1:9", "x")),
                            "127.0.0.1", port).listen()
    finally:
        holder.server.stop()


def test_rlfleet_collector_is_one_process_that_sigterm_ends_with_0(module_coordinator,
                                                                   tmp_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RLFLEET_TOKEN", "RLFLEET_TOKEN_FILE", "RLFLEET_COORDINATOR")}
    with open(tmp_path / "collector.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet", "collector", "--coordinator",
             module_coordinator.url, "--port", str(port), "--worker-id", "one-process"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def registered() -> bool:
            assert proc.poll() is None, (tmp_path / "collector.log").read_text()
            try:
                r = requests.get(f"http://127.0.0.1:{port}/status", timeout=2)
            except requests.ConnectionError:  # not listening yet
                return False
            return r.ok and r.json()["registered"]

        wait_for(registered, 60)
        assert descendants(proc.pid) == [], "a worker role is served by one process"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "collector.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    workers = requests.get(module_coordinator.api("/workers"), timeout=5).json()["workers"]
    assert all(w["worker_id"] != "one-process" or w["state"] != "alive" for w in workers)
