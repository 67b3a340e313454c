"""The JSON wire: request bodies in, JSON responses out.

Bodies: `Content-Type` must be application/json (or a `+json` type), else 415;
the size cap (MAX_CONTENT_LENGTH, 64 KiB) answers 413 before anything is parsed;
bytes that are not UTF-8 JSON, and JSON numbers no float can hold (NaN, Infinity,
1e400) answer 400: Postgres' jsonb would refuse them later with a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask import Response, request
from werkzeug.exceptions import BadRequest, UnsupportedMediaType

MAX_BODY_BYTES = 64 * 1024


def json_body() -> Any:
    """The request's JSON body, or a 400/413/415 HTTPException."""
    mimetype = request.mimetype or ""
    if not (
        mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))
    ):
        raise UnsupportedMediaType("send the body as application/json")
    raw = request.get_data(cache=True)  # raises 413 past MAX_CONTENT_LENGTH
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {_reason(exc)}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).splitlines()[0][:200]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate a client sent (JSON allows "\ud800"), echoed back in a field's
        # path: written as JSON's escape, which UTF-8 can carry.
        body = json.dumps(data, separators=(",", ":")).encode("ascii")
    response = Response(body, status=status, mimetype="application/json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response
