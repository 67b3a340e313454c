"""The API's access log: one line per request, on logger `punctual.access` at INFO.

`GET /jobs 200 3.1 ms` plus, as fields (JSON keys with PUNCTUAL_LOG_FORMAT=json):
method, path, status, duration_ms and owner (once the API key named one). It is
written by the app rather than by gunicorn's access log because only the app knows
the owner, and so that `punctual dev` and tests get the same lines.
"""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request

log = logging.getLogger("punctual.access")


def _start() -> None:
    g.request_started = time.perf_counter()


def _finish(response: Response) -> Response:
    started = g.get("request_started")
    duration_ms = round((time.perf_counter() - started) * 1000, 1) if started is not None else None
    owner = g.get("owner")
    log.info(
        "%s %s %d %s ms",
        request.method,
        request.path,
        response.status_code,
        duration_ms,
        extra={
            "method": request.method,
            "path": request.path,
            "status": response.status_code,
            "duration_ms": duration_ms,
            **({"owner": owner} if owner else {}),
        },
    )
    return response


def install(app: Flask) -> None:
    app.before_request(_start)
    app.after_request(_finish)
