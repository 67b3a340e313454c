"""What every delivery carries: the body bytes and Punctual's own headers.

A webhook call and a queue publish send the same thing (docs/api.md "What a target
receives"): the payload as compact JSON, and the headers below, with
`Punctual-Signature` computed over exactly the bytes sent. Both callers build
them here so that the two can never drift apart.
"""

from __future__ import annotations

import json
from datetime import datetime

from app.core.timefmt import format_instant
from punctual_client.signature import signature_header

__all__ = ["RESERVED_HEADERS", "is_reserved_header", "encode_payload", "idempotency_key", "delivery_headers"]

# Names a job's own headers may not set (compared case-insensitively): Punctual's
# own headers (every name starting "punctual-", so a job can never forge a signature
# or an attempt), the idempotency key, the trace context (a call's trace is its run's),
# and those that describe the body or the connection, which the HTTP client owns.
# Validation refuses them at create time and the webhook caller drops them at call
# time, from this one list.
RESERVED_HEADER_PREFIX = "punctual-"
RESERVED_HEADERS = frozenset(
    {
        "idempotency-key",
        "traceparent",
        "tracestate",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "host",
    }
)


def is_reserved_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_HEADER_PREFIX)


# One encoder for every call: json.dumps with options of its own builds a new one per call.
_PAYLOAD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode_payload(payload: object) -> bytes:
    """The payload as compact UTF-8 JSON: the exact body that is signed and sent."""
    return _PAYLOAD_ENCODER.encode(payload).encode("utf-8")


def idempotency_key(job_id: str, scheduled_for: datetime) -> str:
    """`<job_id>:<scheduled_for>`: the same on every retry, redelivery and replay."""
    return f"{job_id}:{format_instant(scheduled_for)}"


def delivery_headers(
    *,
    job_id: str,
    scheduled_for: datetime,
    attempt: int,
    body: bytes,
    signing_secrets: tuple[str, ...],
    timestamp: int | None = None,
    traceparent: str | None = None,
) -> dict[str, str]:
    """Punctual's headers for one delivery of `body` (all values are strings).

    `signing_secrets` is the owner's current secret, then the previous one while a
    rotation window lasts: one `v1` each in Punctual-Signature. `traceparent` is the
    W3C trace context of the call (app.tracing: the run's trace).

    Content-Type is not included: a webhook GET or DELETE must not send one, and
    AMQP carries it as a message property rather than a header.
    """
    instant = format_instant(scheduled_for)
    headers = {
        "Idempotency-Key": f"{job_id}:{instant}",  # idempotency_key's form, the instant printed once
        "Punctual-Job-Id": str(job_id),
        "Punctual-Scheduled-For": instant,
        "Punctual-Attempt": str(int(attempt)),
        "Punctual-Signature": signature_header(signing_secrets, body, timestamp),
    }
    if traceparent is not None:
        headers["traceparent"] = traceparent
    return headers
