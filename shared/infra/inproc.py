"""In-process HTTP: a role's WSGI app answered by this very process, with no socket.

The single-process runner (`rlfleet single`) runs the cluster's own services in one process:
the coordinator's Flask app and each worker's. They still talk the control plane's HTTP, the
same requests and answers, validated by the same routes; only the transport changes. An app
is served under a name (`serve`), which gives it a URL of the form `http://<name>.inproc`
(the `.inproc` suffix resolves nowhere, so such a URL can only mean this process); an
`HttpClient` of that URL calls the app through WSGI on the caller's thread
(`rlfleet.shared.infra.http`). A name nothing serves answers as a refused connection does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from werkzeug.datastructures import Headers
from werkzeug.test import EnvironBuilder, run_wsgi_app

SUFFIX = ".inproc"

WsgiApp = Callable[..., Any]

_apps: dict[str, WsgiApp] = {}
_lock = threading.Lock()


def url_of(name: str) -> str:
    return f"http://{name}{SUFFIX}"


def serve(name: str, app: WsgiApp) -> str:
    """Answer requests to `url_of(name)` with `app` from now on; that URL."""
    with _lock:
        if name in _apps:
            raise ValueError(f"{url_of(name)} is served already")
        _apps[name] = app
    return url_of(name)


def stop(name: str) -> None:
    """Stop answering for `name` (its URL then refuses, as a stopped server's does)."""
    with _lock:
        _apps.pop(name, None)


def is_inproc(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host.endswith(SUFFIX)


def app_at(url: str) -> WsgiApp | None:
    """The app serving `url` in this process, or None."""
    host = urlsplit(url).hostname or ""
    with _lock:
        return _apps.get(host[:-len(SUFFIX)]) if host.endswith(SUFFIX) else None


def call(app: WsgiApp, method: str, target: str, data: bytes | None,
         headers: Mapping[str, str]) -> tuple[int, Headers, bytes]:
    """One request through `app`: (status, headers, body)."""
    path, _, query = target.partition("?")
    builder = EnvironBuilder(path=path, query_string=query, method=method, data=data,
                             headers=Headers(headers))
    try:
        environ = builder.get_environ()
    finally:
        builder.close()
    body_iter, status, answer_headers = run_wsgi_app(app, environ, buffered=True)
    try:
        body = b"".join(body_iter)
    finally:
        close = getattr(body_iter, "close", None)  # WSGI: an iterable's optional close
        if close is not None:
            close()
    return int(status.split(" ", 1)[0]), Headers(answer_headers), body
