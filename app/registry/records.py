"""Job rows <-> the pure core's values (Schedule, DstPolicy, RetryPolicy).

The registry keeps a schedule as columns; the API and the pollers both read and
write it through these few functions so the mapping lives in one place.

`run_row` is the one place a new run row is shaped (the runs table is both the
history and the outbox: see app.registry.schema's docstring): every row carries every
column, so a batch of them is one INSERT (app.registry.statements.INSERT_RUNS), and what a
claim, a skipped occurrence or an off-schedule retry writes differs only in what they say.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.core.jitter import fire_at
from app.core.retries import RetryPolicy
from app.core.schedules import DstPolicy, Schedule

# A job or run row as the code reads it: a RowMapping from `.mappings()`, or a plain
# dict (a row built in code, a test's row). Not Mapping[str, Any]: SQLAlchemy types a
# RowMapping's keys as "a name or a column", and Mapping is invariant in its key.
Row = Mapping[Any, Any]


def schedule_of(row: Row) -> Schedule:
    return Schedule(
        kind=row["schedule_kind"],
        run_at=row["run_at"],
        cron=row["cron"],
        timezone=row["timezone"],
        interval_s=row["interval_s"],
        start_at=row["start_at"],
        end_at=row["end_at"],
    )


def schedule_columns(schedule: Schedule) -> dict[str, Any]:
    return {
        "schedule_kind": schedule.kind,
        "run_at": schedule.run_at,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "interval_s": schedule.interval_s,
        "start_at": schedule.start_at,
        "end_at": schedule.end_at,
    }


def dst_of(row: Row) -> DstPolicy:
    return DstPolicy(gap=row["dst_gap"], overlap=row["dst_overlap"])


def dst_columns(dst: DstPolicy) -> dict[str, Any]:
    return {"dst_gap": dst.gap, "dst_overlap": dst.overlap}


def retry_of(row: Row) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=row["retry_max_attempts"],
        backoff_s=row["retry_backoff_s"],
        max_backoff_s=row["retry_max_backoff_s"],
    )


def retry_columns(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "retry_max_attempts": policy.max_attempts,
        "retry_backoff_s": policy.backoff_s,
        "retry_max_backoff_s": policy.max_backoff_s,
    }


def new_job_row(
    *,
    job_id: uuid.UUID,
    shard: int,
    owner: str,
    name: str,
    target: Mapping[str, Any],
    payload: Any,
    schedule: Schedule,
    retry: RetryPolicy,
    misfire: str,
    dst: DstPolicy,
    jitter_s: int,
    first: datetime,
    now: datetime,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    labels: Mapping[str, str] | None = None,
    job_key: str | None = None,
    overlap: str = "buffer_one",
) -> dict[str, Any]:
    """The row of a new `scheduled` job whose first nominal occurrence is `first`.

    The one shape of a fresh job: the API's create writes it, and tests and
    benchmarks that insert jobs in bulk write exactly the same.
    """
    return {
        "job_id": job_id,
        "shard": shard,
        "owner": owner,
        "name": name,
        "target": target,
        "payload": payload,
        **schedule_columns(schedule),
        **retry_columns(retry),
        "misfire": misfire,
        **dst_columns(dst),
        "jitter_s": jitter_s,
        "state": "scheduled",
        "next_run_at": fire_at(job_id, first, jitter_s),
        "nominal_at": first,
        "attempt": 0,
        "misfire_exempt": False,
        "skipped_after": None,
        "skipped_through": None,
        "lease_token": None,
        "leased_until": None,
        "idempotency_key": idempotency_key,
        "request_hash": request_hash,
        "created_at": now,
        "updated_at": now,
        "labels": dict(labels or {}),
        "job_key": job_key,
        "rescheduled_at": None,
        "overlap": overlap,
    }


def run_row(
    *,
    job_id: uuid.UUID,
    shard: int,
    owner: str,
    origin: str,
    scheduled_for: datetime,
    attempt: int,
    state: str,
    target: Any,
    retry: dict,
    now: datetime,
    **columns: Any,
) -> dict:
    """A new runs row; `columns` sets any of the others (lease_token, due_at, published, ...)."""
    row = {
        "run_id": uuid.uuid4(),
        "job_id": job_id,
        "shard": shard,
        "owner": owner,
        "origin": origin,
        "scheduled_for": scheduled_for,
        "attempt": attempt,
        "state": state,
        "lease_token": None,
        "leased_until": None,
        "due_at": None,
        "published": True,
        "target": target,
        "retry": retry,
        "started_at": None,
        "finished_at": None,
        "lateness_ms": None,
        "status_code": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
    }
    unknown = set(columns) - set(row)
    if unknown:
        raise TypeError(f"not a runs column: {', '.join(sorted(unknown))}")
    row.update(columns)
    return row
