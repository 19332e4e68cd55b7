"""HTTP client for the control plane: JSON in, pydantic out, timeouts and retries always.

Retries cover what a restart or a busy coordinator looks like from outside (connection
refused, reset, an answer cut off mid-body, 502/503/504, 429 with Retry-After); anything else
(a 4xx) is raised at once as `HttpError` carrying the server's JSON error, because sending the
same bad body again cannot help (a 401 included: a wrong token stays wrong). Whatever goes
wrong on the wire ends as `HttpError` once retries run out, never as a `requests` exception:
callers ride out an unreachable peer by catching that one type.

Plain `http://` to a peer no proxy setting covers (every role on its cluster network) goes over
pooled `http.client` connections (`_KeepAlive`), not `requests`: a learner's data process asks
for a sample every few milliseconds, and `requests` costs more client CPU a round trip than
this way does; it also sends headers and body in separate writes, which cost the server a
further read (bench/RESULTS.md has both). `requests` carries HTTPS and proxied traffic.

A URL of an app served in this process (`http://<name>.inproc`, `rlfleet.shared.infra.inproc`:
the single-process runner) is answered through WSGI on the caller's thread, with the same
requests, answers and errors.

Every client carries the cluster's token (`rlfleet.shared.infra.auth.load_token()` unless
given), so every role, the CLI and the benches reach a guarded cluster without each call site
knowing.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import select
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

import requests
from pydantic import BaseModel

from rlfleet.shared.infra import inproc
from rlfleet.shared.infra.auth import auth_headers, load_token

log = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)

_RETRY_STATUS = {429, 502, 503, 504}
# The connection failed: refused, reset, timed out, or closed part-way through the answer
# (`ChunkedEncodingError`: the headers arrived, then the peer died before the body did; a
# server writes the two separately, so a SIGKILLed coordinator can leave exactly that).
_TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout,
                     requests.exceptions.ChunkedEncodingError)


class _Headers(Protocol):
    """A case-insensitive header lookup: what http.client's, werkzeug's and requests'
    answers all have."""

    def get(self, name: str, /) -> str | None: ...


class _Answer(NamedTuple):
    status: int
    headers: _Headers  # from either transport
    content: bytes


class _TransportError(Exception):
    """The connection failed before a whole answer arrived; carries what to tell the user."""


class _KeepAlive:
    """Pooled keep-alive connections to one plain-HTTP peer, safe to share between threads
    (each request takes a connection of its own from the pool and gives it back after).

    A pooled connection the peer has closed meanwhile (an idle timeout, a restart) is seen
    before reuse, as a readable socket, and dropped; one that fails before any answer came
    is tried once more on a fresh connection, as browsers and urllib3 do, so a restart of the
    peer between two requests costs no retry of the caller's."""

    def __init__(self, host: str, port: int, max_idle: int = 16) -> None:
        self.host, self.port, self.max_idle = host, port, max_idle
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def send(self, method: str, target: str, data: bytes | None, headers: dict[str, str],
             timeout: float) -> _Answer:
        conn, reused = self._take(timeout)
        try:
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:  # a fresh connection failing is the peer failing
                    raise
                conn.close()  # the peer had closed the pooled one: once more on a new one
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
            content = resp.read()  # an answer cut off here is not sent again
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            name, text = type(err).__name__, str(err)
            raise _TransportError(text if text.startswith(name) else f"{name}: {text}") from None
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return _Answer(resp.status, resp.headers, content)

    def _take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share its parent's sockets
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if _still_open(conn):
                    conn.timeout = timeout
                    conn.sock.settimeout(timeout)
                    return conn, True
                conn.close()
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive socket has nothing to read; readable means the peer closed it (or
    sent something unasked, which would corrupt the next answer)."""
    if conn.sock is None:
        return False
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    return not poller.poll(0)


class _InProcess:
    """The transport to an app this process serves (`inproc`)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def send(self, method: str, target: str, data: bytes | None, headers: dict[str, str],
             timeout: float) -> _Answer:
        app = inproc.app_at(self.url)
        if app is None:
            raise _TransportError(f"ConnectionRefused: nothing serves {self.url} in this "
                                  "process")
        status, answer_headers, body = inproc.call(app, method, target, data, headers)
        return _Answer(status, answer_headers, body)

    def close(self) -> None:
        return None


class HttpError(RuntimeError):
    """A request that failed for good: a 4xx/5xx answer, or retries exhausted."""

    def __init__(self, message: str, status: int | None = None,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


class _FromEnv:
    """The default token: whatever `load_token()` finds when the client is made."""


FROM_ENV = _FromEnv()


class HttpClient:
    """One base URL, one pooled session. Thread-safe for the usage here (requests' Session
    is safe for concurrent simple requests; each thread may also hold its own client).

    `token` is sent as `Authorization: Bearer <token>` on every request; None sends none."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, retries: int = 5,
                 backoff_s: float = 0.1, max_backoff_s: float = 2.0,
                 headers: dict[str, str] | None = None,
                 token: str | None | _FromEnv = FROM_ENV) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.session = _session_for(self.base_url)
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.headers = dict(auth_headers(load_token() if isinstance(token, _FromEnv)
                                         else token))
        self.headers.update(headers or {})
        self.session.headers.update(self.headers)
        split = urllib.parse.urlsplit(self.base_url)
        self._prefix = split.path
        self._direct: _KeepAlive | _InProcess | None = None
        if inproc.is_inproc(self.base_url):
            self._direct = _InProcess(self.base_url)
        elif (split.scheme == "http" and split.hostname
                and requests.utils.select_proxy(self.base_url, self.session.proxies) is None):
            self._direct = _KeepAlive(split.hostname, split.port or 80)

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        self.session.close()

    def _send(self, method: str, path: str, data: bytes | None, headers: dict[str, str],
              timeout: float) -> _Answer:
        if self._direct is not None:
            return self._direct.send(method, self._prefix + path, data,
                                     {**self.headers, **headers}, timeout)
        try:
            resp = self.session.request(method, f"{self.base_url}{path}", data=data,
                                        headers=headers or None, timeout=timeout)
        except _TRANSPORT_ERRORS as err:
            raise _TransportError(f"{type(err).__name__}: {err}") from None
        return _Answer(resp.status_code, resp.headers, resp.content)

    def request(self, method: str, path: str, body: BaseModel | dict | None = None,
                response_model: type[T] | None = None, *, timeout_s: float | None = None,
                retries: int | None = None,
                accept: tuple[str, Callable[[bytes], T]] | None = None) -> T | dict[str, Any]:
        """`accept`: (media type, decoder): ask for that form of the answer and decode it
        with the decoder when the server gives it (JSON otherwise, as always)."""
        url = f"{self.base_url}{path}"
        data = None
        if body is not None:
            data = (body.model_dump_json() if isinstance(body, BaseModel)
                    else json.dumps(body)).encode()
        attempts = (self.retries if retries is None else retries) + 1
        delay = self.backoff_s
        last: str = ""
        last_status: int | None = None  # of the last answer, when retries ran out on one
        for attempt in range(attempts):
            try:
                headers = {"Content-Type": "application/json"} if data is not None else {}
                if accept is not None:
                    headers["Accept"] = accept[0]
                resp = self._send(method, path, data, headers, timeout_s or self.timeout_s)
            except _TransportError as err:
                last, last_status = str(err), None
            else:
                if resp.status < 400:
                    if accept is not None and (resp.headers.get("Content-Type") or "").startswith(
                            accept[0]):
                        return accept[1](resp.content)
                    if response_model is not None:  # pydantic parses the bytes directly
                        return response_model.model_validate_json(resp.content or b"{}")
                    return json.loads(resp.content) if resp.content else {}
                body_json = _json_or_text(resp.content)
                if resp.status not in _RETRY_STATUS:
                    raise HttpError(f"{method} {url} -> {resp.status}: "
                                    f"{body_json.get('error', body_json)}",
                                    resp.status, body_json)
                last = f"{resp.status}: {body_json.get('error', body_json)}"
                last_status = resp.status
                retry_after = resp.headers.get("Retry-After")
                if retry_after:
                    try:
                        delay = max(delay, float(retry_after))
                    except ValueError:
                        log.debug("ignoring non-numeric Retry-After %r", retry_after)
            if attempt + 1 < attempts:
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_backoff_s)
        # The status goes with it: a caller tells "rate limited" (429) from "unreachable".
        raise HttpError(f"{method} {url} failed after {attempts} attempts: {last}",
                        last_status)

    def get(self, path: str, response_model: type[T] | None = None, **kw) -> Any:
        return self.request("GET", path, None, response_model, **kw)

    def post(self, path: str, body: BaseModel | dict | None = None,
             response_model: type[T] | None = None, **kw) -> Any:
        return self.request("POST", path, body if body is not None else {}, response_model, **kw)

    def delete(self, path: str, **kw) -> Any:
        return self.request("DELETE", path, None, None, **kw)


def _session_for(base_url: str) -> requests.Session:
    """A session whose environment settings (proxies, CA bundle) are read once, here.

    Why: with `trust_env` on, `requests` reads them again on every request, walking the whole
    environment twice for the proxy lookup and stat-ing `~/.netrc`: a sizeable share of a
    round trip's client CPU on loopback, paid under the GIL by the learner's report thread
    (ten times a second) and by every collector's chunk reports. Read once, the same proxy
    rules hold for the process's life. And `.netrc` is left out on purpose: a matching entry
    there would replace the cluster's bearer token with basic auth (`requests` lets netrc
    win)."""
    session = requests.Session()
    session.trust_env = False
    session.proxies.update(requests.utils.get_environ_proxies(base_url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    return session


def _json_or_text(content: bytes) -> dict[str, Any]:
    try:
        data = json.loads(content)
        return data if isinstance(data, dict) else {"error": data}
    except ValueError:
        return {"error": content[:500].decode(errors="replace")}
