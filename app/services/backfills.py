"""Backfill: every occurrence of a job's schedule in a past range, run now.

`POST /jobs/{job_id}/backfill {"start", "end"}` lists the occurrences t of the job's
schedule (its zone, DST rule and bounds) with start <= t <= end <= now, and inserts
one off-schedule run for each (origin `backfill`): `claimed`, with a lease of its own
and published false, so the relay sweep publishes them and the workers start them
under the job's limits, as any run (a rate holds each run once, at its reserved
instant; a cap lets as many run as it has slots). Each run's scheduled_for is its
occurrence, so its Idempotency-Key is that occurrence's: a receiver that handled the
occurrence already recognises it. The job's own cursor is not touched.

The rows are written in one transaction on the job's shard, in batches of
INSERT_BATCH (app.registry.bulk), oldest first; due_at rises by a microsecond per
run, so the sweep publishes them in that order.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from app.core.errors import FieldError, ValidationError
from app.core.schedules import count_fires, iter_fires
from app.core.timefmt import format_instant, parse_instant
from app.registry.engines import Registry
from app.registry.records import Row, dst_of, retry_of, run_row, schedule_of
from app.registry.statements import INSERT_RUNS
from app.services.errors import Conflict, NotFound
from app.services.jobs import locate, select_job

MAX_OCCURRENCES = 10_000
INSERT_BATCH = 1_000
BACKFILL_FIELDS = ("start", "end")
_BEFORE = timedelta(microseconds=1)  # iter_fires lists occurrences strictly after its bound


@dataclass(frozen=True)
class Backfilled:
    job_id: uuid.UUID
    count: int
    first: datetime | None
    last: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id),
            "count": self.count,
            "first": None if self.first is None else format_instant(self.first),
            "last": None if self.last is None else format_instant(self.last),
        }


def parse_range(body: object, now: datetime) -> tuple[datetime, datetime]:
    """The body's `start` and `end`: instants, start <= end <= now. Every bad field
    is listed (ValidationError)."""
    if not isinstance(body, dict):
        raise ValidationError.single("body", "must be a JSON object with start and end")
    errors = [FieldError(str(key), "unknown field") for key in body if key not in BACKFILL_FIELDS]
    bounds: dict[str, datetime] = {}
    for field in BACKFILL_FIELDS:
        if body.get(field) is None:
            errors.append(FieldError(field, "is required: an instant"))
            continue
        try:
            bounds[field] = parse_instant(body[field])
        except ValueError as exc:
            errors.append(FieldError(field, str(exc)))
    end = bounds.get("end")
    if end is not None and end > now:
        errors.append(
            FieldError("end", "must not be in the future: later occurrences are the schedule's own")
        )
    if end is not None and "start" in bounds and bounds["start"] > end:
        errors.append(FieldError("start", "must not be after end"))
    if errors:
        raise ValidationError(errors)
    return bounds["start"], bounds["end"]


def occurrences(job: Row, start: datetime, end: datetime) -> list[datetime]:
    """The job's occurrences in [start, end], oldest first; ValidationError on `end`
    naming how many there are when they are more than MAX_OCCURRENCES.

    An interval schedule without start_at has its grid at the job's creation, first
    point one interval after it; for a range before the creation the grid is extended
    backwards (the creation instant itself is not an occurrence), as a cron expression
    has occurrences before its job existed."""
    schedule, dst, anchor = schedule_of(job), dst_of(job), job["created_at"]
    extended = schedule.kind == "interval" and schedule.start_at is None and schedule.interval_s
    if extended:
        step = timedelta(seconds=schedule.interval_s or 0)
        schedule = replace(schedule, start_at=anchor + ((start - anchor) // step) * step)
    found: list[datetime] = []
    for at in iter_fires(schedule, dst, start - _BEFORE, anchor):
        if at > end:
            return found
        if extended and at == anchor:
            continue
        if len(found) == MAX_OCCURRENCES:
            raise ValidationError.single("end", _too_many(schedule, dst, anchor, start, end, found[-1]))
        found.append(at)
    return found


def _too_many(schedule, dst, anchor, start: datetime, end: datetime, last: datetime) -> str:
    exact = count_fires(schedule, dst, anchor, start - _BEFORE, end)
    if exact is not None:
        held = f"{exact:,} occurrences"
    else:  # a cron schedule: only a walk could count them; the walk so far gives the rate
        estimate = round(MAX_OCCURRENCES * (end - start) / max(last - start, _BEFORE))
        held = f"more than {MAX_OCCURRENCES:,} occurrences (about {estimate:,})"
    return f"the range holds {held}; a backfill takes at most {MAX_OCCURRENCES:,}: split the range"


def backfill(registry: Registry, owner: str, job_id: str, body: object, now: datetime) -> Backfilled:
    """Insert a `backfill` run for every occurrence of the job's schedule in the body's
    range. Conflict for a one-off (no schedule to backfill) and a cancelled job (no new
    run starts for it); NotFound for another owner's job. The runs are written in
    batches of INSERT_BATCH (app.registry.statements.INSERT_RUNS).
    """
    start, end = parse_range(body, now)
    engine, key = locate(registry, job_id)
    # The lease of a run waiting to start, as for a claimed one: thousands of runs may
    # wait in the broker behind each other, and none has been called.
    leased_until = now + timedelta(seconds=registry.settings.queued_lease_s)
    with engine.begin() as conn:
        # FOR SHARE: a concurrent cancel either sees these runs (and fails them) or wins first.
        job = select_job(conn, owner, key, lock=True, share=True)
        if job is None:
            raise NotFound("job")
        if job["schedule_kind"] == "once":
            raise Conflict("a one-off has no schedule to backfill; trigger it instead")
        if job["state"] == "cancelled":
            raise Conflict("the job is cancelled; no new run starts for it")
        found = occurrences(job, start, end)
        target, retry = job["target"], retry_of(job).to_json()
        rows = [
            run_row(
                job_id=key,
                shard=job["shard"],
                owner=owner,
                origin="backfill",
                scheduled_for=at,
                attempt=1,
                state="claimed",
                target=target,
                retry=retry,
                now=now,
                lease_token=uuid.uuid4(),
                leased_until=leased_until,
                due_at=now + index * _BEFORE,
                published=False,
            )
            for index, at in enumerate(found)
        ]
        for batch in range(0, len(rows), INSERT_BATCH):
            INSERT_RUNS.insert(conn, rows[batch : batch + INSERT_BATCH])
    return Backfilled(key, len(found), found[0] if found else None, found[-1] if found else None)
