"""Batch create (`POST /jobs/batch`): many jobs, each with its own answer, written in bulk.

Each job of a batch is validated, and made idempotent, exactly as `POST /jobs` makes
one (app.services.jobs.create_job): its `idempotency_key` field stands for the
Idempotency-Key header (one header cannot serve a thousand jobs), names the job id
(uuid5 of owner and key) and so its shard, and a repeat answers the existing job
when its body (without the key) is equal JSON, a conflict otherwise.

All or nothing per job, not per batch: one invalid job is answered with its own
problem and the others are still created. The writes go in one transaction per
physical DSN, as one `INSERT ... ON CONFLICT (job_id) DO NOTHING RETURNING job_id`
(app.registry.statements.INSERT_NEW_JOBS), then one
SELECT of the ids that were taken already; that is what makes a batch cheap. A DSN
that fails answers its own jobs as unavailable and leaves the others created.

Within one batch, items are answered as if they had been sent one after another:
a second item with an earlier item's key replays (or conflicts with) that job.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from app.core.errors import ValidationError
from app.limits.keys import named_key, record_limit_key
from app.registry import bulk
from app.registry.engines import Registry
from app.registry.records import Row
from app.registry.schema import jobs
from app.registry.sharding import shard_for
from app.registry.statements import INSERT_NEW_JOBS
from app.services import addresses, idempotency
from app.services.errors import Conflict, Unavailable
from app.services.jobs import check_target_grant, first_fire_remembered, spec_row
from app.services.validation import run_at_not_past, validate_job, webhook_urls

MAX_JOBS = 1000
KEY_FIELD = "idempotency_key"
RESOLVE_DEADLINE_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """One job's answer: its row (created, or the earlier one a key stands for), or the error."""

    job: Row | None = None
    created: bool = False
    error: Exception | None = None


@dataclass
class _Plan:
    """One item on its way to the registry."""

    job_id: uuid.UUID | None
    request_hash: str | None  # None: no idempotency key
    row: dict[str, Any] | None  # None: invalid
    error: ValidationError | None


def create_jobs(registry: Registry, owner: str, items: list[Any], now: datetime) -> list[Outcome]:
    """Create every valid item of `items`; one Outcome per item, in order."""
    if len(items) > MAX_JOBS:
        raise ValidationError.single("jobs", f"must hold at most {MAX_JOBS} jobs")
    # Every host of the batch looked up at once, within one deadline: one slow name
    # server costs the batch RESOLVE_DEADLINE_S, not its timeout once per job.
    resolve = addresses.resolve_targets(webhook_urls(items), RESOLVE_DEADLINE_S)
    plans = [_plan(registry, owner, item, now, resolve) for item in items]
    by_engine: dict[int, list[_Placed]] = {}
    for index, plan in enumerate(plans):
        if plan.job_id is not None and (plan.row is not None or plan.request_hash is not None):
            engine_index = registry.database_index(shard_for(plan.job_id, registry.settings.shards))
            by_engine.setdefault(engine_index, []).append((index, plan.job_id, plan))
    answered: dict[int, Outcome] = {}
    for engine_index, placed in by_engine.items():
        try:
            answered.update(_write(registry.engines[engine_index], owner, placed))
        except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
            reason = type(getattr(exc, "orig", None) or exc).__name__
            failure = Unavailable(f"the registry did not answer ({reason}); retry this job")
            answered.update({index: Outcome(error=failure) for index, _, _ in placed})
    # An item no registry saw is invalid and has no key: its own error is its answer.
    outcomes = [answered.get(index) or Outcome(error=plan.error) for index, plan in enumerate(plans)]
    _record_limit_keys(registry, owner, outcomes, now)
    return outcomes


def _plan(registry: Registry, owner: str, item: Any, now: datetime, resolve: addresses.Resolve) -> _Plan:
    if not isinstance(item, dict):
        return _Plan(None, None, None, ValidationError.single("body", "must be a JSON object"))
    body = dict(item)
    key = body.pop(KEY_FIELD, None)
    job_id: uuid.UUID | None
    if key is None:
        job_id, request_hash = uuid.uuid4(), None
    elif not _storable_key(key):
        message = f"must be a string of 1 to {idempotency.KEY_MAX} characters (no NUL, valid Unicode)"
        return _Plan(None, None, None, ValidationError.single(KEY_FIELD, message))
    else:
        job_id, request_hash = idempotency.job_id_for(owner, key), idempotency.body_hash(body)
    shard = shard_for(job_id, registry.settings.shards)
    try:
        spec = validate_job(body, allow_private=registry.settings.private_target_policy, resolve=resolve)
        check_target_grant(registry.settings, owner, spec.target)
        run_at_not_past(spec.schedule, now, registry.settings.misfire_grace_s)
        first = first_fire_remembered(spec.schedule, spec.dst, now, now)
        if first is None:
            raise ValidationError.single("schedule", "has no occurrence left after now (check end_at)")
    except ValidationError as exc:
        return _Plan(job_id, request_hash, None, exc)
    row = spec_row(spec, job_id, shard, owner, first, now, key, request_hash)
    return _Plan(job_id, request_hash, row, None)


def _storable_key(key: object) -> bool:
    """A key the registry can keep: the header's bounds, and text Postgres accepts."""
    if not isinstance(key, str) or not 1 <= len(key) <= idempotency.KEY_MAX or "\x00" in key:
        return False
    try:
        key.encode("utf-8")  # a lone surrogate (JSON allows "\ud800") is not text
    except UnicodeEncodeError:
        return False
    return True


# An item bound for a DSN: its index in the batch, its job id, its plan.
_Placed = tuple[int, uuid.UUID, _Plan]


def _write(engine: sa.Engine, owner: str, plans: list[_Placed]) -> dict[int, Outcome]:
    """One DSN's share of a batch, in one transaction: insert, then read what keys stood for.

    The insert (app.registry.statements.INSERT_NEW_JOBS), the rows in job id order,
    then `SELECT ... FROM jobs WHERE job_id = ANY(:job_id_keys) AND owner = :owner` for
    the keyed jobs whose id was taken already.
    """
    inserter: dict[uuid.UUID, int] = {}  # job id -> the item that inserts it (the first valid one)
    rows = []
    for index, job_id, plan in plans:
        if plan.row is not None and job_id not in inserter:
            inserter[job_id] = index
            rows.append(plan.row)
    with engine.begin() as conn:
        inserted = INSERT_NEW_JOBS.insert_new(conn, rows)
        taken = [
            job_id for _, job_id, plan in plans if plan.request_hash is not None and job_id not in inserted
        ]
        existing: dict[uuid.UUID, Row] = {}
        if taken:
            query = sa.select(jobs).where(
                bulk.key_in(conn, jobs.c.job_id, list(set(taken))), jobs.c.owner == owner
            )
            existing = {row["job_id"]: row for row in conn.execute(query).mappings()}
    created_rows = {row["job_id"]: row for row in rows if row["job_id"] in inserted}
    answered: dict[int, Outcome] = {}
    for index, job_id, plan in plans:
        if job_id in inserted and inserter.get(job_id) == index:
            answered[index] = Outcome(job=created_rows[job_id], created=True)
            continue
        earlier = existing.get(job_id)
        if earlier is None and job_id in inserted and inserter[job_id] < index:
            earlier = created_rows[job_id]  # an earlier item of this batch made it
        if earlier is None:
            # Keyless rows never collide; a keyed one whose id another owner holds cannot
            # happen (the owner is part of the uuid5), so this is the item's own error.
            answered[index] = Outcome(
                error=plan.error or Conflict("the idempotency_key is in use", kind="idempotency-conflict")
            )
        elif earlier["request_hash"] != plan.request_hash:
            conflict = Conflict(
                "this idempotency_key was used with a different job body", kind="idempotency-conflict"
            )
            answered[index] = Outcome(error=conflict)
        else:
            answered[index] = Outcome(job=earlier, created=False)
    return answered


def _record_limit_keys(registry: Registry, owner: str, outcomes: list[Outcome], now: datetime) -> None:
    """A named limits key takes the limits of the last job of the batch created with it."""
    last: dict[str, Mapping[str, Any]] = {}
    for outcome in outcomes:
        if outcome.created and outcome.job is not None:
            name = named_key(outcome.job["target"])
            if name is not None:
                last[name] = outcome.job["target"]
    for target in last.values():
        record_limit_key(registry, owner, target, now)
