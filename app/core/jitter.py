"""Jitter: a deterministic delay per job and occurrence, to smooth round-time spikes.

A million jobs on "0 0 * * *" with jitter_s=60 should spread over the minute, not
all land on 00:00:00. The delay is a hash, not a random draw, so that every process
(the poller computing next_run_at, the janitor, a replay) agrees on it without
storing it, and a restart never moves an occurrence. The idempotency key keeps the
nominal time; only when the run becomes due changes.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta

from app.core.timefmt import format_instant

MAX_JITTER_S = 3600


def jitter_offset(job_id: uuid.UUID | str, nominal: datetime, jitter_s: int) -> timedelta:
    """A delay in [0, jitter_s) seconds at millisecond resolution; 0 when jitter_s is 0.

    Derived from sha256(f"{job_id}:{format_instant(nominal)}"): the same job and
    occurrence always get the same delay, different ones are spread uniformly.
    """
    if jitter_s < 0:
        raise ValueError("jitter_s must not be negative")
    if jitter_s == 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{_canonical(job_id)}:{format_instant(nominal)}".encode()).digest()
    # 64 bits modulo at most 3.6 million milliseconds: the bias is below 1e-12.
    millis = int.from_bytes(digest[:8], "big") % (int(jitter_s) * 1000)
    return timedelta(milliseconds=millis)


def fire_at(job_id: uuid.UUID | str, nominal: datetime, jitter_s: int) -> datetime:
    """When an occurrence is due: its nominal instant plus the job's jitter."""
    return nominal + jitter_offset(job_id, nominal, jitter_s)


def parse_jitter_s(value: object) -> int:
    """The API's jitter_s: an integer 0-3600. Raises ValueError with a 422 message."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise ValueError(f"must be an integer number of seconds, 0 to {MAX_JITTER_S}")
    if not 0 <= value <= MAX_JITTER_S:
        raise ValueError(f"must be between 0 and {MAX_JITTER_S}")
    return int(value)


def _canonical(job_id: uuid.UUID | str) -> str:
    # A UUID and its string (in any case, with or without braces) must hash alike:
    # the API holds strings, the registry holds uuid.UUID.
    if isinstance(job_id, uuid.UUID):
        return str(job_id)
    try:
        return str(uuid.UUID(job_id))
    except ValueError:
        return job_id
