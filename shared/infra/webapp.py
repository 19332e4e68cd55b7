"""Flask plumbing every role's service uses: JSON errors, body validation, size limits.

Every error answer is JSON: `{"error": ..., "field": ...}`, where `field` is the dotted path of
the first offending field for a validation error, so a client sees what to fix.

Bodies are capped at `RLFLEET_MAX_BODY_BYTES` (8 MB unless set), so no client can make a
service buffer an unbounded body in memory (`parse_body` reads a body whole). Werkzeug
refuses a `Content-Length` over it; a chunked body (cheroot sets `wsgi.input_terminated`)
is read up to the limit and refused if it goes on (`read_body`). Either way the answer is a
JSON 413 naming the limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from rlfleet.shared.contract.config import ConfigError

# Flask and werkzeug are imported by the functions that serve: `max_body_bytes` is also read
# by processes that serve nothing (`rlfleet up` checks the setting before starting anyone).
if TYPE_CHECKING:
    from flask import Flask

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("rlfleet.http")

DEFAULT_MAX_BODY = 8 * 1024 * 1024
MAX_BODY_ENV = "RLFLEET_MAX_BODY_BYTES"


def max_body_bytes() -> int:
    """The body size limit: `RLFLEET_MAX_BODY_BYTES`, or `DEFAULT_MAX_BODY`."""
    raw = os.environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{MAX_BODY_ENV} must be a positive number of bytes, got {raw!r}")
    return value


class BadRequest(Exception):
    """A body that does not validate; carries the field it is about."""

    def __init__(self, message: str, field: str | None = None,
                 detail: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message, self.field, self.detail = message, field, detail


def error(status: int, message: str, field: str | None = None, **extra):
    from flask import jsonify

    body = {"error": message, "field": field, **extra}
    return jsonify(body), status


def read_body() -> bytes:
    """The request body, whole, or `RequestEntityTooLarge` when it is over the limit.

    Werkzeug refuses a too-large `Content-Length` up front, but a chunked body (no
    `Content-Length`) is only cut off at the limit, silently: the parser would then see a
    truncated body and answer a misleading 400. One more byte from the server's own stream
    tells a body that ends exactly at the limit from one that goes on."""
    from flask import request
    from werkzeug.exceptions import RequestEntityTooLarge

    data = request.get_data(cache=False)
    limit = request.max_content_length
    if (request.content_length is None and limit is not None and len(data) >= limit
            and request.environ["wsgi.input"].read(1)):
        raise RequestEntityTooLarge()
    return data


def parse_body(model: type[T]) -> T:
    """Validate the request body as `model` (unknown fields are errors)."""
    from flask import request

    data = read_body()
    if request.mimetype not in ("application/json", "") and data:
        raise BadRequest(f"expected Content-Type application/json, got {request.mimetype}")
    if not data:
        data = b"{}"
    try:
        return model.model_validate_json(data)
    except ValidationError as err:
        raise _invalid(err) from None


def _invalid(err: ValidationError) -> BadRequest:
    """The first of pydantic's errors, naming its field."""
    errors = err.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "json_invalid":
        return BadRequest(f"body is not valid JSON: {first['msg']}")
    message = f"{field}: {first['msg']}" if field else first["msg"]
    return BadRequest(message, field, errors)


def parse_query(model: type[T]) -> T:
    """Validate the query string as `model` (unknown or repeated parameters are errors: a
    misspelt `?afer=` must not silently answer from the start)."""
    from flask import request

    args = request.args
    for key in args:
        if len(args.getlist(key)) > 1:
            raise BadRequest(f"{key}: give the parameter once", key)
    try:
        return model.model_validate(args.to_dict(flat=True))
    except ValidationError as err:
        raise _invalid(err) from None


def install_error_handlers(app: Flask) -> None:
    from flask import request
    from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

    if app.config.get("MAX_CONTENT_LENGTH") is None:  # Flask's default config holds None
        app.config["MAX_CONTENT_LENGTH"] = max_body_bytes()

    @app.errorhandler(BadRequest)
    def _bad(err: BadRequest):
        return error(400, err.message, err.field, detail=err.detail)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(err: RequestEntityTooLarge):
        limit = request.max_content_length
        size = request.content_length  # None for a chunked body: cut off at the limit
        what = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        return error(413, f"request body is {what}; the limit is {limit}")

    @app.errorhandler(HTTPException)
    def _http(err: HTTPException):
        return error(err.code or 500, err.description or err.name)

    @app.errorhandler(Exception)
    def _unexpected(err: Exception):
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error(500, f"internal error: {type(err).__name__}: {err}")
