"""HTTP client for the control plane: JSON in, pydantic out, timeouts and retries always.

Retries cover what a restart or a busy coordinator looks like from outside (connection
refused, reset, an answer cut off mid-body, 502/503/504, 429 with Retry-After); anything else
(a 4xx) is raised at once as `HttpError` carrying the server's JSON error, because sending the
same bad body again cannot help (a 401 included: a wrong token stays wrong). Whatever goes
wrong on the wire ends as `HttpError` once retries run out, never as a `requests` exception:
callers ride out an unreachable peer by catching that one type.

Every client carries the cluster's token (`shared.auth.load_token()` unless given), so every
role, the CLI and the benches reach a guarded cluster without each call site knowing.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import requests
from pydantic import BaseModel

from shared.auth import auth_headers, load_token

log = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)

_RETRY_STATUS = {429, 502, 503, 504}
# The connection failed: refused, reset, timed out, or closed part-way through the answer
# (`ChunkedEncodingError`: the headers arrived, then the peer died before the body did; a
# server writes the two separately, so a SIGKILLed coordinator can leave exactly that).
_TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout,
                     requests.exceptions.ChunkedEncodingError)


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
        self.session.headers.update(auth_headers(
            load_token() if isinstance(token, _FromEnv) else token))
        if headers:
            self.session.headers.update(headers)

    def close(self) -> None:
        self.session.close()

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
                    else requests.models.complexjson.dumps(body))
        attempts = (self.retries if retries is None else retries) + 1
        delay = self.backoff_s
        last: str = ""
        last_status: int | None = None  # of the last answer, when retries ran out on one
        for attempt in range(attempts):
            try:
                headers = {"Content-Type": "application/json"} if data is not None else {}
                if accept is not None:
                    headers["Accept"] = accept[0]
                resp = self.session.request(method, url, data=data, headers=headers or None,
                                            timeout=timeout_s or self.timeout_s)
            except _TRANSPORT_ERRORS as err:
                last, last_status = f"{type(err).__name__}: {err}", None
            else:
                if resp.status_code < 400:
                    if accept is not None and resp.headers.get(
                            "Content-Type", "").startswith(accept[0]):
                        return accept[1](resp.content)
                    if response_model is not None:  # pydantic parses the bytes directly
                        return response_model.model_validate_json(resp.content or b"{}")
                    return resp.json() if resp.content else {}
                body_json = _json_or_text(resp)
                if resp.status_code not in _RETRY_STATUS:
                    raise HttpError(f"{method} {url} -> {resp.status_code}: "
                                    f"{body_json.get('error', body_json)}",
                                    resp.status_code, body_json)
                last = f"{resp.status_code}: {body_json.get('error', body_json)}"
                last_status = resp.status_code
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
    environment twice for the proxy lookup and stat-ing `~/.netrc`: a fifth of a round trip's
    client CPU on loopback, paid under the GIL by the learner's report thread (ten times a
    second) and by every collector's chunk reports. Read once, the same proxy rules hold for
    the process's life. And `.netrc` is left out on purpose: a matching entry there would
    replace the cluster's bearer token with basic auth (`requests` lets netrc win)."""
    session = requests.Session()
    session.trust_env = False
    session.proxies.update(requests.utils.get_environ_proxies(base_url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    return session


def _json_or_text(resp: requests.Response) -> dict[str, Any]:
    try:
        data = resp.json()
        return data if isinstance(data, dict) else {"error": data}
    except ValueError:
        return {"error": resp.text[:500]}
