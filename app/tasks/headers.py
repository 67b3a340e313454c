"""What every delivery carries: the body bytes and Punctual's own headers.

A webhook call and a queue publish send the same thing (API.md "What a target
receives"): the payload as compact JSON, and the headers below, with
`Punctual-Signature` computed over exactly the bytes sent. Both callers build
them here so that the two can never drift apart.
"""
from __future__ import annotations

import json
from datetime import datetime

from app.sdk.signature import signature_header
from app.timefmt import format_instant

__all__ = ["RESERVED_HEADERS", "encode_payload", "idempotency_key", "delivery_headers"]

# Names a job's own headers may not set (compared case-insensitively): Punctual's
# headers, and those that describe the body or the connection, which the HTTP
# client owns.
RESERVED_HEADERS = frozenset(
    {
        "idempotency-key",
        "punctual-job-id",
        "punctual-scheduled-for",
        "punctual-attempt",
        "punctual-signature",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
    }
)


def encode_payload(payload: object) -> bytes:
    """The payload as compact UTF-8 JSON: the exact body that is signed and sent."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def idempotency_key(job_id: str, scheduled_for: datetime) -> str:
    """`<job_id>:<scheduled_for>`: the same on every retry, redelivery and replay."""
    return f"{job_id}:{format_instant(scheduled_for)}"


def delivery_headers(
    *,
    job_id: str,
    scheduled_for: datetime,
    attempt: int,
    body: bytes,
    signing_secret: str,
    timestamp: int | None = None,
) -> dict[str, str]:
    """Punctual's headers for one delivery of `body` (all values are strings).

    Content-Type is not included: a webhook GET or DELETE must not send one, and
    AMQP carries it as a message property rather than a header.
    """
    return {
        "Idempotency-Key": idempotency_key(job_id, scheduled_for),
        "Punctual-Job-Id": str(job_id),
        "Punctual-Scheduled-For": format_instant(scheduled_for),
        "Punctual-Attempt": str(int(attempt)),
        "Punctual-Signature": signature_header(signing_secret, body, timestamp),
    }
