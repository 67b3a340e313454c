"""Job rows <-> the pure core's values (Schedule, DstPolicy, RetryPolicy).

The registry keeps a schedule as columns; the API and the pollers both read and
write it through these few functions so the mapping lives in one place.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping

from app.jitter import fire_at

from app.retries import RetryPolicy
from app.schedules import DstPolicy, Schedule


def schedule_of(row: Mapping[str, Any]) -> Schedule:
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


def dst_of(row: Mapping[str, Any]) -> DstPolicy:
    return DstPolicy(gap=row["dst_gap"], overlap=row["dst_overlap"])


def dst_columns(dst: DstPolicy) -> dict[str, Any]:
    return {"dst_gap": dst.gap, "dst_overlap": dst.overlap}


def retry_of(row: Mapping[str, Any]) -> RetryPolicy:
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
    }
