"""Flask plumbing every role's service uses: JSON errors, body validation, size limits.

Every error answer is JSON: `{"error": ..., "field": ...}`, where `field` is the dotted path of
the first offending field for a validation error, so a client sees what to fix.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from flask import Flask, jsonify, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("rlfleet.http")

DEFAULT_MAX_BODY = 8 * 1024 * 1024


class BadRequest(Exception):
    """A body that does not validate; carries the field it is about."""

    def __init__(self, message: str, field: str | None = None,
                 detail: list[dict] | None = None) -> None:
        super().__init__(message)
        self.message, self.field, self.detail = message, field, detail


def error(status: int, message: str, field: str | None = None, **extra):
    body = {"error": message, "field": field, **extra}
    return jsonify(body), status


def parse_body(model: type[T]) -> T:
    """Validate the request body as `model` (unknown fields are errors)."""
    data = request.get_data(cache=False)
    if request.mimetype not in ("application/json", "") and data:
        raise BadRequest(f"expected Content-Type application/json, got {request.mimetype}")
    if not data:
        data = b"{}"
    try:
        return model.model_validate_json(data)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_context=False, include_input=False)
        first = errors[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "json_invalid":
            raise BadRequest(f"body is not valid JSON: {first['msg']}") from None
        message = f"{field}: {first['msg']}" if field else first["msg"]
        raise BadRequest(message, field, errors) from None


def install_error_handlers(app: Flask) -> None:
    if app.config.get("MAX_CONTENT_LENGTH") is None:  # Flask's default config holds None
        app.config["MAX_CONTENT_LENGTH"] = DEFAULT_MAX_BODY

    @app.errorhandler(BadRequest)
    def _bad(err: BadRequest):
        return error(400, err.message, err.field, detail=err.detail)

    @app.errorhandler(HTTPException)
    def _http(err: HTTPException):
        return error(err.code or 500, err.description or err.name)

    @app.errorhandler(Exception)
    def _unexpected(err: Exception):
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error(500, f"internal error: {type(err).__name__}: {err}")
