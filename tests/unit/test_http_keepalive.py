"""`HttpClient`'s plain-HTTP transport: one kept-alive connection reused across requests and
threads, and a connection the server closed meanwhile replaced without costing a retry.

Real HTTP on loopback: a Flask app served by cheroot (what every role serves with), which
says which client port each request came from, so a test sees how many connections the
client opened."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from cheroot.wsgi import Server
from flask import Flask, request

from rlfleet.shared.infra.http import HttpClient, HttpError

from .helpers import free_port


def _app() -> Flask:
    app = Flask("keepalive")

    @app.get("/port")
    def port():
        return {"port": int(request.environ["REMOTE_PORT"])}

    @app.post("/echo")
    def echo():
        body = request.get_json()
        if "n" not in body:
            return {"error": "n: required", "field": "n"}, 400
        return {"n": body["n"], "port": int(request.environ["REMOTE_PORT"])}

    return app


class Served:
    """A cheroot server on a fixed port that can be stopped and started again there."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server: Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = Server(("127.0.0.1", self.port), _app(), numthreads=8)
        self.server.prepare()
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        assert self.server is not None and self.thread is not None
        self.server.stop()
        self.thread.join(timeout=10)


@pytest.fixture()
def served() -> Iterator[Served]:
    s = Served()
    s.start()
    yield s
    s.stop()


@pytest.fixture()
def client(served) -> Iterator[HttpClient]:
    """No retries: whatever the transport does about a closed connection, it does itself."""
    c = HttpClient(served.url, timeout_s=5, retries=0, token=None)
    yield c
    c.close()


def test_requests_in_a_row_share_one_connection(client):
    ports = {client.get("/port")["port"] for _ in range(20)}
    assert len(ports) == 1
    assert client.post("/echo", {"n": 3})["port"] in ports


def test_a_connection_the_server_closed_is_replaced_without_a_retry(served, client):
    first = client.get("/port")["port"]
    served.stop()  # closes the kept-alive connection; the client is not told
    served.start()
    # the pooled connection must be seen as closed, not tried and failed
    assert client.get("/port")["port"] != first
    assert client.post("/echo", {"n": 1})["n"] == 1


def test_threads_share_a_client_and_each_gets_its_own_answer(client):
    answers: dict[int, list[int]] = {}

    def ask(t: int) -> None:
        answers[t] = [client.post("/echo", {"n": t * 100 + i})["n"] for i in range(25)]

    threads = [threading.Thread(target=ask, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert answers == {t: [t * 100 + i for i in range(25)] for t in range(8)}


def test_an_error_answer_keeps_its_status_and_field_and_the_connection(client):
    port = client.get("/port")["port"]
    with pytest.raises(HttpError) as raised:
        client.post("/echo", {})
    assert raised.value.status == 400 and raised.value.body["field"] == "n"
    assert client.get("/port")["port"] == port


def test_a_server_that_is_gone_is_an_http_error_without_a_status(served):
    client = HttpClient(served.url, timeout_s=2, retries=1, backoff_s=0.01, token=None)
    try:
        client.get("/port")
        served.stop()
        with pytest.raises(HttpError) as raised:
            client.get("/port")
        assert raised.value.status is None and "ConnectionRefusedError" in str(raised.value)
    finally:
        served.start()  # for the fixture's stop
        client.close()
