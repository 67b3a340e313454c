"""Job rows for tests and the bench, written straight into the registry.

Rows are exactly what the API's create writes (app/services/jobs.py), so the claim sees
nothing it would not see in production; inserting them in bulk lets a test or the
bench make thousands of due jobs in a second.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from app.core.retries import RetryPolicy
from app.core.schedules import DstPolicy, Schedule
from app.core.timefmt import utcnow
from app.registry.engines import Registry
from app.registry.records import new_job_row
from app.registry.schema import jobs, runs
from app.registry.sharding import shard_for


def webhook_target(url: str, **extra: Any) -> dict:
    return {"type": "webhook", "url": url, "method": "POST", "headers": {}, "timeout_s": 30, **extra}


def job_row(
    shards: int,
    *,
    owner: str = "tests",
    target: dict | None = None,
    run_at: datetime | None = None,
    cron: str | None = None,
    interval_s: int | None = None,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    first: datetime | None = None,
    payload: Any = None,
    max_attempts: int = 5,
    backoff_s: float = 10,
    max_backoff_s: float = 3600,
    misfire: str = "run_once",
    jitter_s: int = 0,
    job_id: uuid.UUID | None = None,
    shard: int | None = None,
    created_at: datetime | None = None,
    name: str = "test-job",
) -> dict:
    """A `scheduled` job row. `first` is the first nominal occurrence (run_at for a one-off)."""
    job_id = job_id or uuid.uuid4()
    if shard is not None:  # find an id that lands on this shard
        while shard_for(job_id, shards) != shard:
            job_id = uuid.uuid4()
    now = created_at or utcnow()
    first = first or run_at
    if run_at is not None:
        schedule = Schedule(kind="once", run_at=run_at)
    elif cron:
        schedule = Schedule(kind="cron", cron=cron, start_at=start_at, end_at=end_at)
    else:
        schedule = Schedule(kind="interval", interval_s=interval_s, start_at=start_at, end_at=end_at)
    return new_job_row(
        job_id=job_id,
        shard=shard_for(job_id, shards),
        owner=owner,
        name=name,
        target=target or webhook_target("http://127.0.0.1:9/"),
        payload=payload if payload is not None else {"job": str(job_id)},
        schedule=schedule,
        retry=RetryPolicy(max_attempts, backoff_s, max_backoff_s),
        misfire=misfire,
        dst=DstPolicy(),
        jitter_s=jitter_s,
        first=first,
        now=now,
    )


def insert_jobs(registry: Registry, rows: Iterable[dict], chunk: int = 1000) -> None:
    by_engine: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_engine[registry.database_index(row["shard"])].append(row)
    for index, group in by_engine.items():
        with registry.engines[index].begin() as conn:
            for start in range(0, len(group), chunk):
                conn.execute(jobs.insert(), group[start : start + chunk])


def job(registry: Registry, job_id: uuid.UUID) -> dict:
    engine = registry.engine_for_shard(shard_for(job_id, registry.settings.shards))
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(jobs).where(jobs.c.job_id == job_id)).mappings().one())


def runs_of(registry: Registry, job_id: uuid.UUID) -> list[dict]:
    """A job's runs, oldest first (by scheduled_for, then attempt)."""
    engine = registry.engine_for_shard(shard_for(job_id, registry.settings.shards))
    with engine.connect() as conn:
        rows = (
            conn.execute(
                sa.select(runs)
                .where(runs.c.job_id == job_id)
                .order_by(runs.c.scheduled_for, runs.c.attempt, runs.c.created_at)
            )
            .mappings()
            .all()
        )
    return [dict(row) for row in rows]


def ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)
