"""`HttpClient` reads the environment's proxy settings once, when it is made, and never
lets `~/.netrc` replace the cluster's bearer token.

Real HTTP on loopback: a Flask app that echoes the Authorization header it got, and a port
with nothing behind it standing for a proxy that is down (a request sent through it fails,
which is how a test sees that the proxy was used)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from flask import Flask, request
from werkzeug.serving import make_server

from rlfleet.shared.infra.http import HttpClient, HttpError

from .helpers import closed_port


@pytest.fixture()
def echo_url() -> Iterator[str]:
    app = Flask("echo")

    @app.get("/who")
    def who():
        return {"authorization": request.headers.get("Authorization")}

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=5)


def _clear_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                 "http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_a_proxy_in_the_environment_at_creation_is_used(monkeypatch, echo_url):
    _clear_proxy_env(monkeypatch)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port()}")
    client = HttpClient(echo_url, timeout_s=2, retries=0, token=None)
    with pytest.raises(HttpError, match="ProxyError|ConnectionError"):
        client.get("/who")
    client.close()


def test_no_proxy_is_honoured_and_later_changes_do_not_reach_a_made_client(monkeypatch,
                                                                           echo_url):
    _clear_proxy_env(monkeypatch)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    bypassing = HttpClient(echo_url, timeout_s=2, retries=0, token=None)
    assert bypassing.get("/who") == {"authorization": None}
    # read once: the setting the client was made under holds for its life
    monkeypatch.delenv("no_proxy")
    assert bypassing.get("/who") == {"authorization": None}
    bypassing.close()


def test_netrc_does_not_replace_the_bearer_token(monkeypatch, tmp_path, echo_url):
    _clear_proxy_env(monkeypatch)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    client = HttpClient(echo_url, timeout_s=2, retries=0, token="cluster-token")
    assert client.get("/who") == {"authorization": "Bearer cluster-token"}
    client.close()
