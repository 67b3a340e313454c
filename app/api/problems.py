"""Errors as application/problem+json (RFC 9457), for every error the API answers.

A problem is `{"type", "title", "status", "detail", "errors": [{"field", "message"}]}`;
`errors` is always present (empty unless fields are at fault). The service errors
(ValidationError 422, NotFound 404, Conflict 409, RateLimited 429 with Retry-After,
Unavailable 503 in a batch item),
authentication (401), Flask's own errors (400, 404, 405, 413, 415 raised by routing
or body parsing), a database that cannot be reached (503 with Retry-After) and a
write refused by a shard move's fence (503, Retry-After: 1) all come out in this one
shape, so a client parses one thing.
"""

from __future__ import annotations

import json
import logging

import psycopg
from flask import Flask, Response, request
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException

from app.core.errors import FieldError, ValidationError
from app.registry.engines import is_fence_error
from app.services.errors import Conflict, NotFound, RateLimited, Unavailable

PROBLEM_TYPE = "application/problem+json"
_TYPE_BASE = "urn:punctual:problem:"

log = logging.getLogger(__name__)


class Unauthorized(Exception):
    """No API key, or one that belongs to nobody."""


def problem_json(
    status: int, title: str, detail: str, *, kind: str | None = None, errors: list[FieldError] | None = None
) -> dict:
    return {
        "type": _TYPE_BASE + kind if kind else "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "errors": [e.as_dict() for e in errors or ()],
    }


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    kind: str | None = None,
    errors: list[FieldError] | None = None,
    headers: dict | None = None,
) -> Response:
    body = problem_json(status, title, detail, kind=kind, errors=errors)
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_TYPE)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def problem_for(exc: Exception) -> dict:
    """The problem body of a service error, for an answer that carries one per item
    (POST /jobs/batch): the same body the error gets as a whole answer."""
    if isinstance(exc, ValidationError):
        fields = ", ".join(dict.fromkeys(e.field for e in exc.errors))
        return problem_json(
            422, "Invalid fields", f"invalid: {fields}", kind="invalid-fields", errors=exc.errors
        )
    if isinstance(exc, Conflict):
        return problem_json(409, "Conflict", exc.detail, kind=exc.kind)
    if isinstance(exc, Unavailable):
        return problem_json(503, "Service Unavailable", str(exc), kind="registry-unavailable")
    raise TypeError(f"no problem for {type(exc).__name__}") from exc


def _validation(exc: ValidationError) -> Response:
    body = problem_for(exc)
    return problem(422, body["title"], body["detail"], kind="invalid-fields", errors=exc.errors)


def _not_found(exc: NotFound) -> Response:
    what = str(exc) or "resource"
    return problem(404, "Not found", f"no such {what}", kind="not-found")


def _conflict(exc: Conflict) -> Response:
    return problem(409, "Conflict", exc.detail, kind=exc.kind)


def _rate_limited(exc: RateLimited) -> Response:
    return problem(
        429,
        "Too Many Requests",
        exc.detail,
        kind="rate-limited",
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def _unauthorized(_exc: Unauthorized) -> Response:
    return problem(
        401,
        "Unauthorized",
        "send a valid API key as 'Authorization: Bearer <key>'",
        kind="unauthorized",
        headers={"WWW-Authenticate": 'Bearer realm="punctual"'},
    )


def _http(exc: HTTPException) -> Response:
    headers = {}
    valid_methods = getattr(exc, "valid_methods", None)  # set on a MethodNotAllowed
    if exc.code == 405 and valid_methods:
        headers["Allow"] = ", ".join(valid_methods)
    detail = exc.description or exc.name
    if exc.code == 413 and request.max_content_length:  # Werkzeug's own text names no figure
        detail = f"the body is over {byte_size(request.max_content_length)}, the most this route takes"
    return problem(exc.code or 500, exc.name, detail, headers=headers)


def byte_size(count: int) -> str:
    """64 KiB, 8 MiB: a limit as docs/api.md writes it."""
    for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count:,} bytes"


# Errors that mean "a database cannot be reached now", not "this request is wrong":
# a refused or dropped connection, a pool with no connection to give within its timeout.
# psycopg's own OperationalError too: a reconnect inside the pool's checkout can raise
# it unwrapped.
REGISTRY_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
    sa_exc.DisconnectionError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
RETRY_AFTER_S = 5


def _registry_unavailable(exc: Exception) -> Response:
    log.warning("registry unavailable: %s", type(exc).__name__, exc_info=exc)
    return problem(
        503,
        "Service Unavailable",
        "the job registry cannot be reached; retry later",
        kind="registry-unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _unexpected(exc: Exception) -> Response:
    if is_fence_error(exc):  # a write to a shard in the fence of a move: seconds at most
        return problem(
            503,
            "Service Unavailable",
            "the job's shard is being moved; try again in a moment",
            kind="shard-moving",
            headers={"Retry-After": "1"},
        )
    log.exception("unhandled error", exc_info=exc)
    return problem(500, "Internal Server Error", "the server failed to answer this request")


def install(app: Flask) -> None:
    """Route every error of `app` through problem+json."""
    app.register_error_handler(ValidationError, _validation)
    app.register_error_handler(NotFound, _not_found)
    app.register_error_handler(Conflict, _conflict)
    app.register_error_handler(RateLimited, _rate_limited)
    app.register_error_handler(Unauthorized, _unauthorized)
    app.register_error_handler(HTTPException, _http)
    for unavailable in REGISTRY_UNAVAILABLE:
        app.register_error_handler(unavailable, _registry_unavailable)
    app.register_error_handler(Exception, _unexpected)
