"""`/dev/echo`: the built-in webhook target of `punctual dev` (only when settings.dev_mode).

Contract:
- A call is any request that carries `Punctual-Job-Id` (whatever its method) and any
  POST, PUT, PATCH or DELETE. It is recorded and answered with what was received:
  `{"received_at", "method", "path", "query", "headers", "body", "raw_body", "job_id",
  "idempotency_key", "traceparent", "run_id", "signature"}`; `body` is the JSON value
  when the body parses, else its text; `raw_body` is the body exactly as received, as
  text (what the signature covers: verify_signature(secret,
  headers["Punctual-Signature"], raw_body) checks it); `run_id` is the run the
  `traceparent` names (app.tracing); `signature` is "valid", or why not ("invalid:
  ...", "no job ...") as punctual_client.verify_signature judges
  `Punctual-Signature` under the job owner's signing secret.
- The answer is 200, or the status `?status=NNN` names (100-599, else 422), to
  watch retries (503), a Retry-After (`&retry_after=5`) and dead letters (404).
- `GET /dev/echo` without `Punctual-Job-Id` lists the recorded calls, newest
  first: `{"items": [...]}`; `?job_id=...` keeps one job's.

Calls are kept in memory, the last MAX_CALLS, in the API process: `punctual dev`
runs the API with one worker process, so every call and every listing meet in one
place. No API key is asked: this is a target, and `punctual dev` listens on
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import uuid

import sqlalchemy as sa
from flask import Blueprint, current_app, request

from app.api.wire import json_response
from app.core.errors import ValidationError
from app.core.timefmt import format_instant, utcnow
from app.registry.schema import jobs
from app.registry.sharding import shard_for
from app.tracing import run_of
from punctual_client import SignatureError, verify_signature

bp = Blueprint("dev", __name__)

MAX_CALLS = 200
CALL_METHODS = ("POST", "PUT", "PATCH", "DELETE")

_calls: collections.deque[dict] = collections.deque(maxlen=MAX_CALLS)
_lock = threading.Lock()


@bp.route("/dev/echo", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
def echo():
    if request.method in ("GET", "HEAD") and "Punctual-Job-Id" not in request.headers:
        return _listing()
    status = _status()
    call = _record()
    with _lock:
        _calls.append(call)
    # Straight to stderr, which `punctual dev` shows in its terminal: the point is
    # to see the call happen (the app's logger is quiet below WARNING).
    print(
        f"dev echo: {call['method']} {call['path']} -> {status}, Idempotency-Key {call['idempotency_key']},"
        f" signature {call['signature']}",
        file=sys.stderr,
        flush=True,
    )
    headers = {"Retry-After": request.args["retry_after"]} if "retry_after" in request.args else None
    return json_response(call, status, headers)


def recorded_calls() -> list[dict]:
    """The recorded calls, newest first (for tests)."""
    with _lock:
        return list(reversed(_calls))


def _listing():
    job_id = request.args.get("job_id")
    items = [call for call in recorded_calls() if job_id is None or call["job_id"] == job_id]
    return json_response({"items": items})


def _status() -> int:
    raw = request.args.get("status", "200")
    if not (raw.isascii() and raw.isdigit()) or not 100 <= int(raw) <= 599:
        raise ValidationError.single("status", "must be an HTTP status code, 100-599")
    return int(raw)


def _record() -> dict:
    raw = request.get_data(cache=True)
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = text
    job_id = request.headers.get("Punctual-Job-Id")
    traceparent = request.headers.get("traceparent")
    run = run_of(traceparent)
    return {
        "received_at": format_instant(utcnow()),
        "method": request.method,
        "path": request.path,
        "query": request.args.to_dict(),
        "headers": dict(request.headers.items()),
        "body": body,
        "raw_body": text,
        "job_id": job_id,
        "idempotency_key": request.headers.get("Idempotency-Key"),
        "traceparent": traceparent,
        "run_id": None if run is None else str(run),
        "signature": _signature(job_id, raw),
    }


def _signature(job_id: str | None, raw: bytes) -> str:
    """How the signature fares under the signing secret of the job's owner."""
    if job_id is None:
        return "no job: no Punctual-Job-Id header"
    services = current_app.extensions["punctual"]
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        return f"no job: {job_id!r} is not a job id"
    engine = services.registry.engine_for_shard(shard_for(parsed, services.settings.shards))
    with engine.connect() as conn:
        owner = conn.execute(sa.select(jobs.c.owner).where(jobs.c.job_id == parsed)).scalar()
    secret = services.owners.signing_secret(owner) if owner is not None else None
    if secret is None:
        return f"no job: {job_id} is not in this registry"
    try:
        verify_signature(secret, request.headers.get("Punctual-Signature"), raw)
    except SignatureError as exc:
        return f"invalid: {exc}"
    return "valid"
