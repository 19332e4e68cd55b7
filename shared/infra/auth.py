"""The cluster's shared API token: where it comes from, and the guard every service installs.

One secret for the whole cluster, because every role calls every other one (workers call the
coordinator, the coordinator pushes tasks to workers, the CLI and the benches read status):
a per-role credential would add key management without narrowing what a leaked one can do.

- `load_token()` reads it from `RLFLEET_TOKEN`, or from the file `RLFLEET_TOKEN_FILE` names
  (how Kubernetes and Docker mount secrets, keeping them out of `ps` and `/proc/*/environ`).
- `install_token_guard(app, token)` makes every request but `GET /health` carry
  `Authorization: Bearer <token>`. It is a `before_request` hook, so a request without the
  right token is answered 401 before its body is read or any handler runs: it changes nothing.
  `/health` stays open because orchestrators' probes (compose healthchecks, Kubernetes
  readiness) carry no credentials, and it tells nothing about the run.

With no token configured everything stays open: the local default (`rlfleet up` on loopback).
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.shared.contract.config import ConfigError

if TYPE_CHECKING:  # Flask only where a guard is installed: clients (the launcher) need none
    from flask import Flask

TOKEN_ENV = "RLFLEET_TOKEN"
TOKEN_FILE_ENV = "RLFLEET_TOKEN_FILE"
# Requests answered without a token: liveness and readiness probes.
OPEN = frozenset({("GET", "/health"), ("HEAD", "/health")})


class TokenError(ConfigError):
    """A token setting that cannot be used; the message names the variable (and the file).
    A `ConfigError`, so the CLI reports it as a usage error (exit code 2), not a traceback."""


def load_token() -> str | None:
    """The configured token, or None when neither variable is set (the open local default).

    An empty `RLFLEET_TOKEN`, an unreadable or empty token file, or both variables set are
    errors rather than "no token": each is a misconfiguration that would otherwise leave a
    cluster that was meant to be guarded wide open, or guarded by a token nobody intended.
    """
    value, path = os.environ.get(TOKEN_ENV), os.environ.get(TOKEN_FILE_ENV)
    if value is not None and path is not None:
        raise TokenError(f"both {TOKEN_ENV} and {TOKEN_FILE_ENV} are set; set only one")
    if path is not None:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise TokenError(f"{TOKEN_FILE_ENV}={path}: cannot read the token file: "
                             f"{err}") from None
        if not token:
            raise TokenError(f"{TOKEN_FILE_ENV}={path}: the token file is empty")
        return _checked(token, f"{TOKEN_FILE_ENV}={path}")
    if value is not None:
        token = value.strip()
        if not token:
            raise TokenError(f"{TOKEN_ENV} is set but empty; unset it to run without a token")
        return _checked(token, TOKEN_ENV)
    return None


def _checked(token: str, source: str) -> str:
    """Tokens travel in an HTTP header: printable ASCII without spaces survives every hop."""
    if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
        raise TokenError(f"{source}: the token must be printable ASCII without spaces")
    return token


def auth_headers(token: str | None) -> dict[str, str]:
    """The header a client sends with `token`; none without one."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def install_token_guard(app: Flask, token: str | None,
                        static: tuple[str, ...] = ()) -> bool:
    """Require `Authorization: Bearer <token>` on every request to `app` but `GET /health`.
    Does nothing when `token` is None. Returns whether a guard was installed.

    `static`: path prefixes (a trailing `/`) or exact paths that GET and HEAD reach without
    the token: the dashboard's page and its scripts, which hold no data of the run (the page
    asks for the token, then sends it with each API call it makes).

    Install it after any hook that only observes requests (the Prometheus timer), so refused
    requests are still counted; the guard itself must come before anything that reads bodies
    or changes state, which in Flask means any view: `before_request` hooks run first.
    """
    from flask import request

    if token is None:
        return False
    expected = token.encode("ascii")

    def _static(path: str) -> bool:
        return any(path == p or (p.endswith("/") and p != "/" and path.startswith(p))
                   for p in static)

    @app.before_request
    def _require_token():
        if (request.method, request.path) in OPEN:
            return None
        if request.method in ("GET", "HEAD") and _static(request.path):
            return None
        presented = _bearer(request.headers.get("Authorization"))
        if presented is None:
            return _unauthorized("this endpoint needs an 'Authorization: Bearer <token>' "
                                 "header")
        # Constant time on bytes, so the answer's timing does not leak how much matched.
        if not hmac.compare_digest(presented.encode("latin-1", "replace"), expected):
            return _unauthorized("the bearer token is not this cluster's token")
        return None

    return True


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def _unauthorized(message: str):
    from rlfleet.shared.infra.webapp import error

    resp, status = error(401, message, "Authorization")
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp, status
