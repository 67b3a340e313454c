"""Job service: one function per API verb, SQLAlchemy Core on the job's shard.

Every function takes the owner and answers NotFound for another owner's job (the
API's 404, never a 403 that would confirm it exists). State changes are single
conditional UPDATEs (`WHERE state IN (...)`) or run under the job row's lock, so a
concurrent API call, poller claim or worker completion cannot interleave into an
invalid state; docs/design.md ("API verbs") is the contract implemented here.
Lock order, as everywhere in Punctual: the job row, then its run rows.

Idempotent create (app.services.idempotency): with an Idempotency-Key the job id is uuid5(owner, key), so the
key names the shard and the primary key is the uniqueness check (no global table).
The first INSERT wins; every other request with that key reads the winner and
compares request hashes: equal bodies answer the same job, different ones Conflict.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import sqlite

from app.core.errors import FieldError, ValidationError
from app.core.jitter import fire_at
from app.core.schedules import DstPolicy, Schedule, first_fire
from app.core.timefmt import truncate_to_ms
from app.limits.keys import record_limit_key
from app.registry.bulk import key_in, same_token, state_among
from app.registry.dialect import carries_labels, is_postgres, random_uuid
from app.registry.engines import Registry
from app.registry.estimates import counts_by_state
from app.registry.records import (
    Row,
    dst_columns,
    dst_of,
    new_job_row,
    retry_columns,
    retry_of,
    run_row,
    schedule_columns,
    schedule_of,
)
from app.registry.schema import JOB_STATES, jobs, runs
from app.registry.sharding import shard_for
from app.services import idempotency
from app.services.errors import Conflict, NotFound, RateLimited
from app.services.job_keys import check_job_key, job_id_for_key
from app.services.pagination import Page, decode_cursor, merge_newest, newest_first
from app.services.validation import JobSpec, run_at_not_past, validate_changes, validate_job
from app.settings import Settings

LIVE_STATES = ("scheduled", "running", "paused")  # the states a job can still change from
# Triggers of one job: each is a call of its target, made at once, so one API key
# cannot turn a job into a flood of calls (docs/api.md "Bounds").
TRIGGERS_PER_WINDOW = 10
TRIGGER_WINDOW_S = 60
FINAL_STATES = ("completed", "cancelled", "dead")


@dataclass(frozen=True)
class Created:
    job: Row
    created: bool  # False: an earlier request with the same Idempotency-Key made it


# --- create ------------------------------------------------------------------------


def spec_row(
    spec: JobSpec,
    job_id: uuid.UUID,
    shard: int,
    owner: str,
    first: datetime,
    now: datetime,
    idempotency_key: str | None,
    request_hash: str | None,
) -> dict:
    """The new job row of a validated body (POST /jobs and each job of POST /jobs/batch)."""
    return new_job_row(
        job_id=job_id,
        shard=shard,
        owner=owner,
        name=spec.name,
        target=spec.target,
        payload=spec.payload,
        schedule=spec.schedule,
        retry=spec.retry,
        misfire=spec.misfire,
        dst=spec.dst,
        jitter_s=spec.jitter_s,
        first=first,
        now=now,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        labels=spec.labels,
        overlap=spec.overlap,
    )


def create_job(
    registry: Registry, owner: str, body: object, idempotency_key: str | None, now: datetime
) -> Created:
    """Validate and insert a job: one INSERT on the job's shard (plus, only for a target
    with a named limits key, that key's limits on the home DSN).

    With an Idempotency-Key, a repeated request answers the existing job (created
    False) when its body is equal JSON, and raises Conflict otherwise. A repeat whose
    body no longer validates (say its host stopped resolving) is answered the same
    way: the key's first answer stands, as Stripe's do.
    """
    if idempotency_key is None:
        job_id, request_hash = uuid.uuid4(), None
    else:
        job_id, request_hash = idempotency.job_id_for(owner, idempotency_key), idempotency.body_hash(body)
    shard = shard_for(job_id, registry.settings.shards)
    engine = registry.engine_for_shard(shard)
    try:
        spec = validate_job(body, allow_private=registry.settings.private_target_policy)
        check_target_grant(registry.settings, owner, spec.target)
        run_at_not_past(spec.schedule, now, registry.settings.misfire_grace_s)
        first = first_fire_remembered(spec.schedule, spec.dst, now, now)
        if first is None:
            raise ValidationError.single("schedule", "has no occurrence left after now (check end_at)")
    except ValidationError:
        if request_hash is not None:
            with engine.connect() as conn:
                existing = select_job(conn, owner, job_id)
            if existing is not None:
                return Created(_same_request(existing, request_hash), created=False)
        raise
    row = spec_row(spec, job_id, shard, owner, first, now, idempotency_key, request_hash)
    if _insert(engine, row, idempotent=request_hash is not None):
        record_limit_key(registry, owner, spec.target, now)  # a named key: nothing otherwise
        return Created(row, created=True)
    with engine.connect() as conn:
        existing = select_job(conn, owner, job_id)
    if existing is None:  # uuid5 includes the owner: only a deleted row could do this
        raise Conflict("the Idempotency-Key is in use", kind="idempotency-conflict")
    return Created(_same_request(existing, request_hash), created=False)


def _same_request(existing: Row, request_hash: str | None) -> Row:
    if existing["request_hash"] != request_hash:
        raise Conflict(
            "this Idempotency-Key was used with a different request body", kind="idempotency-conflict"
        )
    return existing


def _insert(engine: sa.Engine, row: dict[str, Any], *, idempotent: bool) -> bool:
    """INSERT one job in one statement (autocommit: no BEGIN/COMMIT round trips).

    Idempotent inserts skip a row whose id exists and answer False then (RETURNING,
    not rowcount: under psycopg 3 SQLAlchemy reports -1 for it). On Postgres the
    statement goes straight to the pooled driver connection: SQLAlchemy's execution
    layer was a sizeable share of a create's CPU, on the API's hottest path. Other
    dialects (the embedded SQLite of `punctual dev`) use Core.
    """
    if is_postgres(engine):
        return _insert_postgres(engine, row, idempotent)
    statement = _INSERT_IGNORING_CONFLICT if idempotent else jobs.insert()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        result = conn.execute(statement, row)
        return not idempotent or result.first() is not None


_INSERT_IGNORING_CONFLICT = (
    sqlite.insert(jobs).on_conflict_do_nothing(index_elements=[jobs.c.job_id]).returning(jobs.c.job_id)
)
_COLUMNS = [column.name for column in jobs.columns]  # the Table is the one source of the column list
_JSON_COLUMNS = [column.name for column in jobs.columns if isinstance(column.type, sa.JSON)]
_PG_INSERT = "INSERT INTO jobs ({}) VALUES ({})".format(
    ", ".join(_COLUMNS), ", ".join(f"%({name})s" for name in _COLUMNS)
)
_PG_INSERT_IGNORING_CONFLICT = _PG_INSERT + " ON CONFLICT (job_id) DO NOTHING RETURNING job_id"


def _insert_postgres(engine: sa.Engine, row: dict[str, Any], idempotent: bool) -> bool:
    params = dict(row)
    for name in _JSON_COLUMNS:  # as SQLAlchemy's JSON type writes them: None is JSON null
        params[name] = Jsonb(params[name])
    pooled = engine.raw_connection()  # the registry's pool: its liveness check and recycling as for Core
    try:
        driver = pooled.driver_connection
        assert driver is not None  # None only once the pooled connection is invalidated
        driver.autocommit = True
        try:
            with driver.cursor() as cursor:
                cursor.execute(_PG_INSERT_IGNORING_CONFLICT if idempotent else _PG_INSERT, params)
                return not idempotent or cursor.fetchone() is not None
        finally:
            driver.autocommit = False  # the pool hands it out next for transactions
    finally:
        pooled.close()


# Cron schedule -> (since, first occurrence after since). Many jobs share an expression
# ("0 0 * * *"), and a croniter call cost more than the rest of a create.
_FIRST_FIRE: dict[tuple[Schedule, DstPolicy], tuple[datetime, datetime]] = {}
_FIRST_FIRE_MAX = 4096


def first_fire_remembered(
    schedule: Schedule, dst: DstPolicy, now: datetime, anchor: datetime
) -> datetime | None:
    """first_fire, remembered for cron schedules while `now` stays before the answer.

    Exact, not approximate: if r is the first occurrence after `since`, none lies in
    (since, r), so for every now in [since, r) the first occurrence after now is r.
    A cron schedule ignores `anchor` (only an interval grid uses it), so the
    expression, bounds, zone and DST policy are the whole key.
    """
    key = (schedule, dst)
    if schedule.kind == "cron":
        hit = _FIRST_FIRE.get(key)
        if hit is not None and hit[0] <= now < hit[1]:
            return hit[1]
    try:
        first = first_fire(schedule, dst, now, anchor)
    except OverflowError:  # a schedule whose next occurrence is past year 9999
        return None
    if schedule.kind == "cron" and first is not None:
        if len(_FIRST_FIRE) >= _FIRST_FIRE_MAX:
            _FIRST_FIRE.clear()  # crude but bounded; a miss only costs one computation
        _FIRST_FIRE[key] = (now, first)
    return first


# --- read --------------------------------------------------------------------------


def get_job(registry: Registry, owner: str, job_id: str | uuid.UUID) -> Row:
    engine, key = locate(registry, job_id)
    with engine.connect() as conn:
        row = select_job(conn, owner, key)
    if row is None:
        raise NotFound("job")
    return row


def list_jobs(
    registry: Registry,
    owner: str,
    *,
    state: str | None,
    name: str | None,
    limit: int,
    cursor: str | None,
    labels: Mapping[str, str] | None = None,
    keyed: bool | None = None,
) -> Page:
    """The owner's jobs, newest first by (created_at, job_id), merged over every DSN;
    with `labels`, only the jobs that carry every one of those pairs; with `keyed`,
    only the jobs that have a key (True) or none (False)."""
    if state is not None and state not in JOB_STATES:
        raise ValidationError.single("state", f"must be one of {', '.join(JOB_STATES)}")
    if name is not None and "\x00" in name:  # Postgres refuses NUL in text: say so, not 500
        raise ValidationError.single("name", "must not contain NUL characters")
    position = decode_cursor("j", cursor)
    query = sa.select(jobs).where(jobs.c.owner == owner)
    if state is not None:
        query = query.where(jobs.c.state == state)
    if name is not None:
        query = query.where(jobs.c.name == name)
    if keyed is not None:
        query = query.where(jobs.c.job_key.isnot(None) if keyed else jobs.c.job_key.is_(None))
    query = newest_first(query, jobs.c.created_at, jobs.c.job_id, position, limit)
    pages = []
    for index in range(len(registry.engines)):

        def page(conn: sa.Connection, index: int = index) -> list:
            selected = query.where(carries_labels(conn, jobs.c.labels, labels)) if labels else query
            return list(conn.execute(served_only(registry, index, selected, jobs)).mappings())

        pages.append(registry.read(index, page))  # a replica read (docs/api.md "Replica reads")
    return merge_newest("j", pages, limit, "created_at", "job_id")


Statement = TypeVar("Statement", sa.Select, sa.Update)


def served_only(registry: Registry, index: int, query: Statement, table: sa.Table) -> Statement:
    """`query` on database `index` without the rows of shards it holds but does not
    serve (a move's copy or leftovers), so a moving job is never listed twice."""
    foreign = registry.foreign_shards(index)
    return query.where(table.c.shard.notin_(foreign)) if foreign else query


def count_by_state(registry: Registry) -> dict[str, int]:
    """Jobs per state over every database (operator metrics; not owner-scoped): exact
    while the table is small, PostgreSQL's estimate once it is big (app.registry.estimates)."""
    counts = dict.fromkeys(JOB_STATES, 0)
    for index in range(len(registry.engines)):
        for state, count in registry.read(index, lambda conn: counts_by_state(conn, jobs)).items():
            counts[state] = counts.get(state, 0) + count
    return counts


def backlog_by_shard(registry: Registry, now: datetime) -> dict[int, tuple[int, float]]:
    """(jobs due by `now` and not claimed yet, seconds the oldest of them has been due)
    per logical shard, (0, 0.0) for a shard with none (operator metrics).

    A backlog that stays above zero, or grows old, means the pollers and workers do not
    keep up, or nothing polls the shard.
    """
    found = dict.fromkeys(range(registry.settings.shards), (0, 0.0))
    query = (
        sa.select(jobs.c.shard, sa.func.count(), sa.func.min(jobs.c.next_run_at))
        .where(jobs.c.state == "scheduled", jobs.c.next_run_at <= now)
        .group_by(jobs.c.shard)
    )
    for index in range(len(registry.engines)):
        for shard, count, oldest in registry.read(index, lambda conn: conn.execute(query).all()):
            before, age = found.get(shard, (0, 0.0))
            oldest_age = max(0.0, (now - oldest).total_seconds())
            found[shard] = (before + count, max(age, oldest_age))
    return found


# --- change ------------------------------------------------------------------------


def patch_job(registry: Registry, owner: str, job_id: str, body: object, now: datetime) -> Row:
    """Replace the named fields; recompute the schedule cursor when it may move.

    Allowed on scheduled, paused and running jobs. A run claimed but not started
    yet (claimed ahead, or waiting in the broker) is taken back first (`_unclaim`),
    so the change applies to it. With a run in flight the cursor is left to that
    run's completion, which reads the new schedule; otherwise a changed schedule,
    dst or jitter_s restarts the cursor at first_fire(now) (no occurrence left: the
    job is completed).
    """
    changes = validate_changes(body, allow_private=registry.settings.private_target_policy)
    if "target" in changes:
        check_target_grant(registry.settings, owner, changes["target"])
    if "schedule" in changes:
        run_at_not_past(changes["schedule"], now, registry.settings.misfire_grace_s)
    engine, key = locate(registry, job_id)
    with engine.begin() as conn:
        row = select_job(conn, owner, key, lock=True)
        if row is None:
            raise NotFound("job")
        if row["state"] in FINAL_STATES:
            raise Conflict(f"the job is {row['state']}; it can no longer be changed")
        patched = _replace(conn, row, changes, now)
    if "target" in changes:  # the key's limits become this job's (docs/api.md "Limits")
        record_limit_key(registry, owner, changes["target"], now)
    return patched


def _replace(conn: sa.Connection, row: Row, changes: Mapping[str, Any], now: datetime) -> Row:
    """Write `changes` (validated fields) to the locked job `row`, taking back a run
    claimed but not started first when the change is part of a run."""
    if set(changes) - {"name", "labels"}:  # neither is part of a run
        row = _unclaim(conn, row, now) or row
    values = _replaced(row, changes, now)
    return (
        conn.execute(jobs.update().where(jobs.c.job_id == row["job_id"]).values(values).returning(*jobs.c))
        .mappings()
        .one()
    )


def _replaced(row: Row, changes: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The column values a change writes to `row` (no I/O; a dry run shows them).

    A job in a final state is revived (`PUT /jobs/by-key`): `scheduled`, or `running`
    while a run of it is still in flight, its cursor restarted as for a new schedule.
    A changed schedule, dst or jitter_s restarts the cursor at first_fire(now) when no
    run holds the job, and is remembered (`rescheduled_at`) so that a run in flight
    moves on strictly after the change (app.lifecycle.cursor)."""
    values: dict[str, Any] = {"updated_at": now}
    for field in ("name", "target", "payload", "misfire", "jitter_s", "labels", "overlap"):
        if field in changes:
            values[field] = changes[field]
    schedule = changes.get("schedule", schedule_of(row))
    dst = changes.get("dst", dst_of(row))
    jitter_s: int = changes["jitter_s"] if "jitter_s" in changes else row["jitter_s"]
    values.update(schedule_columns(schedule), **dst_columns(dst))
    if "retry" in changes:
        values.update(retry_columns(changes["retry"]))
    moved = (schedule, dst, jitter_s) != (schedule_of(row), dst_of(row), row["jitter_s"])
    state = row["state"]
    revived = state in FINAL_STATES
    if revived:
        state = "scheduled" if row["lease_token"] is None else "running"
        values["state"] = state
    if moved:
        values["rescheduled_at"] = now
    if (moved or revived) and row["lease_token"] is None:
        values.update(_cursor_at(row["job_id"], schedule, dst, jitter_s, now, row["created_at"], state))
    return values


# --- declarative jobs: PUT /jobs/by-key/{key} ------------------------------------

CHANGES = ("created", "updated", "unchanged")


@dataclass(frozen=True)
class Put:
    job: Row  # as it is now (or, for a dry run, as it would be)
    change: str  # created | updated | unchanged


def put_job(
    registry: Registry, owner: str, key: str, body: object, now: datetime, *, dry_run: bool = False
) -> Put:
    """Create the owner's job `key`, or replace it whole with `body` (a create body).

    The job id is uuid5(owner, key) (app.services.job_keys): the same key always names
    the same job, on the same shard. A body equal to the job as it is changes nothing
    (`unchanged`: no write, a claimed run is left alone). Otherwise every field is
    replaced as a PATCH of all of them replaces it (a run claimed but not started is
    taken back, a schedule change restarts the cursor strictly after now); a job
    cancelled, completed or dead is revived, except a completed or dead one the body
    does not change (a one-off that ran is not run again by applying the same file).
    `dry_run` decides and answers the same, writing nothing.
    """
    errors: list[FieldError] = []
    try:
        check_job_key(key, "key")
    except ValidationError as exc:
        errors.extend(exc.errors)
    if isinstance(body, dict) and "key" in body:
        if body["key"] != key:
            errors.append(FieldError("key", "must equal the key in the path"))
        body = {field: value for field, value in body.items() if field != "key"}
    try:
        spec = validate_job(body, allow_private=registry.settings.allow_private_targets)
        check_target_grant(registry.settings, owner, spec.target)
        run_at_not_past(spec.schedule, now, registry.settings.misfire_grace_s)
    except ValidationError as exc:
        raise ValidationError(errors + exc.errors) from None
    if errors:
        raise ValidationError(errors)
    job_id = job_id_for_key(owner, key)
    shard = shard_for(job_id, registry.settings.shards)
    engine = registry.engine_for_shard(shard)
    for _ in range(2):  # a concurrent PUT of a new key inserts first: then this one replaces
        try:
            with engine.begin() as conn:
                put = _put(conn, owner, key, job_id, shard, spec, now, dry_run)
        except sa.exc.IntegrityError:
            continue
        if put.change != "unchanged" and not dry_run:
            record_limit_key(registry, owner, spec.target, now)
        return put
    raise Conflict(f"the job {key!r} is being written by another request; send it again")


def _put(
    conn: sa.Connection,
    owner: str,
    key: str,
    job_id: uuid.UUID,
    shard: int,
    spec: JobSpec,
    now: datetime,
    dry_run: bool,
) -> Put:
    row = select_job(conn, owner, job_id, lock=not dry_run)
    if row is None:
        first = first_fire_remembered(spec.schedule, spec.dst, now, now)
        if first is None:
            raise ValidationError.single("schedule", "has no occurrence left after now (check end_at)")
        new = spec_row(spec, job_id, shard, owner, first, now, None, None)
        new["job_key"] = key
        if not dry_run:
            conn.execute(jobs.insert().values(new))
        return Put(new, "created")
    if row["state"] != "cancelled" and _same_spec(row, spec):
        return Put(row, "unchanged")
    if first_fire_remembered(spec.schedule, spec.dst, now, row["created_at"]) is None:
        raise ValidationError.single("schedule", "has no occurrence left after now (check end_at)")
    changes = spec_changes(spec)
    if dry_run:
        return Put({**row, **_replaced(row, changes, now)}, "updated")
    return Put(_replace(conn, row, changes, now), "updated")


def spec_changes(spec: JobSpec) -> dict[str, Any]:
    """Every field of `spec`, as validate_changes gives them: a whole replacement."""
    return {
        "name": spec.name,
        "target": spec.target,
        "payload": spec.payload,
        "schedule": spec.schedule,
        "retry": spec.retry,
        "misfire": spec.misfire,
        "dst": spec.dst,
        "jitter_s": spec.jitter_s,
        "labels": spec.labels,
        "overlap": spec.overlap,
    }


def _same_spec(row: Row, spec: JobSpec) -> bool:
    """Whether `row` already is what `spec` describes (JSON compared as Python compares
    it: the 1 a client sent equals the 1.0 a float column gives back)."""
    return (
        row["name"] == spec.name
        and row["target"] == spec.target
        and row["payload"] == spec.payload
        and schedule_of(row) == spec.schedule
        and retry_of(row) == spec.retry
        and row["misfire"] == spec.misfire
        and dst_of(row) == spec.dst
        and row["jitter_s"] == spec.jitter_s
        and row["labels"] == spec.labels
        and row["overlap"] == spec.overlap
    )


def get_job_by_key(registry: Registry, owner: str, key: str) -> Row:
    """The owner's job `key`; NotFound for none (and for a key no job could have)."""
    try:
        check_job_key(key)
    except ValidationError:
        raise NotFound("job") from None
    return get_job(registry, owner, job_id_for_key(owner, key))


def _cursor_at(
    job_id: uuid.UUID,
    schedule: Schedule,
    dst: DstPolicy,
    jitter_s: int,
    now: datetime,
    anchor: datetime,
    state: str,
) -> dict[str, Any]:
    first = first_fire_remembered(schedule, dst, now, anchor)
    cursor = {"attempt": 0, "misfire_exempt": False, "skipped_after": None, "skipped_through": None}
    if first is None:
        return {**cursor, "state": "completed", "next_run_at": None, "nominal_at": None}
    return {**cursor, "state": state, "next_run_at": fire_at(job_id, first, jitter_s), "nominal_at": first}


def cancel_job(registry: Registry, owner: str, job_id: str, now: datetime) -> Row:
    """Cancel: no new run starts. Runs not yet started fail ("job cancelled"); a run
    already running may finish. Repeating it answers the cancelled job again."""
    engine, key = locate(registry, job_id)
    with engine.begin() as conn:
        row = _transition(
            conn,
            owner,
            key,
            LIVE_STATES,
            "cancelled",
            now,
            idempotent=("cancelled",),
            extra={"next_run_at": None},
        )
        conn.execute(_fail_claimed_runs(conn, [key], now))
        if row["lease_token"] is not None:
            _fail_unstarted(conn, [(row["job_id"], row["lease_token"])], now)
    return row


def pause_job(registry: Registry, owner: str, job_id: str, now: datetime) -> Row:
    """Pause: no new run starts; a run in flight finishes (its lease is kept). A run
    claimed but not started yet is taken back (`_unclaim`): it has not begun, and a
    job paused before its instant must not fire at it."""
    engine, key = locate(registry, job_id)
    with engine.begin() as conn:
        row = _transition(conn, owner, key, ("scheduled", "running"), "paused", now, idempotent=("paused",))
        return _unclaim(conn, row, now) or row


def _unclaim(conn: sa.Connection, job: Row, now: datetime) -> Row | None:
    """Take back the job's claimed schedule run if it has not started; returns the
    job row then (lease cleared, `running` back to `scheduled`), else None.

    Such a run has no row yet (a claimed row, made before runs got theirs at their
    start, goes: nothing happened, no attempt spent, as for a run held by a limit);
    the job keeps next_run_at, so the next claim (or a resume) takes the
    same occurrence again. Its dispatch message, when it arrives, finds neither the
    run nor the lease and starts nothing. The caller holds the job row's lock,
    which a worker's start also takes first: either the start committed (the run is
    `running`, nothing is taken back) or it waits and then finds nothing to start.
    """
    token = job["lease_token"]
    if token is None:
        return _rewind(conn, job, now) if job["overlap"] == "allow" else None
    if not _take_back(conn, [(job["job_id"], token)], now):
        return None
    return conn.execute(sa.select(jobs).where(jobs.c.job_id == job["job_id"])).mappings().one()


def _rewind(conn: sa.Connection, job: Row, now: datetime) -> Row | None:
    """`_unclaim` for a job whose overlap is `allow`: its occurrences claimed and not
    started (first attempts, each leased on its own row; a retry keeps its row, as an
    off-schedule run's does) are taken back, and the cursor, which the claim moved past
    them, goes back to the earliest, so the claim (or the resume) takes them again.
    Returns the job row then, else None."""
    taken = (
        conn.execute(
            sa.delete(runs)
            .where(
                runs.c.job_id == job["job_id"],
                runs.c.origin == "schedule",
                runs.c.attempt == 1,
                runs.c.leased_until.isnot(None),
                state_among(runs.c.state, ("claimed",)),
            )
            .returning(runs.c.scheduled_for)
        )
        .scalars()
        .all()
    )
    if not taken:
        return None
    earliest = min(taken)
    return (
        conn.execute(
            jobs.update()
            .where(jobs.c.job_id == job["job_id"])
            .values(
                nominal_at=earliest,
                next_run_at=fire_at(job["job_id"], earliest, job["jitter_s"]),
                attempt=0,
                misfire_exempt=False,
                updated_at=now,
            )
            .returning(*jobs.c)
        )
        .mappings()
        .one()
    )


def _take_back(conn: sa.Connection, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], now: datetime) -> set:
    """`_unclaim` for many jobs whose rows the caller has locked: `leases` are (job_id,
    lease_token) pairs; returns the ids of the jobs whose claimed run was taken back."""
    if not leases:
        return set()
    tokens = dict(leases)
    found = conn.execute(
        sa.select(runs.c.run_id, runs.c.job_id, runs.c.lease_token, runs.c.state).where(
            key_in(conn, runs.c.job_id, sorted(tokens)),
            runs.c.origin == "schedule",
            state_among(runs.c.state, ("claimed", "running")),
        )
    ).all()
    under_lease = [row for row in found if tokens.get(row.job_id) == row.lease_token]
    # A run leased on its job has no row until it starts (app.lifecycle.lease); a row
    # still `claimed` is one a claim made before that was so.
    started = {row.job_id for row in under_lease if row.state == "running"}
    claimed_rows = [row.run_id for row in under_lease if row.state == "claimed"]
    taken = sorted(job_id for job_id in tokens if job_id not in started)
    if not taken:
        return set()
    if claimed_rows:
        conn.execute(sa.delete(runs).where(key_in(conn, runs.c.run_id, claimed_rows)))
    for job_id in taken:
        conn.execute(
            jobs.update()
            .where(jobs.c.job_id == job_id, same_token(jobs.c.lease_token, tokens[job_id]))
            .values(
                state=sa.case((jobs.c.state == "running", "scheduled"), else_=jobs.c.state),
                lease_token=None,
                leased_until=None,
                updated_at=now,
            )
        )
    return set(taken)


def resume_job(registry: Registry, owner: str, job_id: str, now: datetime) -> Row:
    """Resume: `running` while a lease is still held, else `scheduled`. next_run_at is
    kept, so the next claim applies the misfire policy to what was missed."""
    engine, key = locate(registry, job_id)
    state = sa.case((jobs.c.lease_token.is_(None), "scheduled"), else_="running")
    with engine.begin() as conn:
        return _transition(conn, owner, key, ("paused",), state, now, idempotent=("scheduled", "running"))


# --- the label verbs: every matching job of the owner at once ---------------------


@dataclass(frozen=True)
class Selected:
    """What a label verb did: the owner's jobs that carry the selector's labels, and
    how many of them it changed (the others were already in the verb's state, or
    could not move: a cancelled job is not resumed)."""

    matched: int
    changed: int

    def as_dict(self) -> dict[str, int]:
        return {"matched": self.matched, "changed": self.changed}


def pause_selected(registry: Registry, owner: str, selector: Mapping[str, str], now: datetime) -> Selected:
    """`pause_job` for every job of `owner` carrying `selector`'s labels: claimed runs
    not started are taken back; runs in flight finish."""

    def pause(conn: sa.Connection, ids: list) -> int:
        moved = (
            conn.execute(
                jobs.update()
                .where(key_in(conn, jobs.c.job_id, ids), jobs.c.state.in_(("scheduled", "running")))
                .values(state="paused", updated_at=now)
                .returning(*jobs.c)
            )
            .mappings()
            .all()
        )
        _take_back(conn, [(row["job_id"], row["lease_token"]) for row in moved if row["lease_token"]], now)
        for row in moved:
            if row["overlap"] == "allow":
                _rewind(conn, row, now)
        return len(moved)

    return _for_selected(registry, owner, selector, pause)


def resume_selected(registry: Registry, owner: str, selector: Mapping[str, str], now: datetime) -> Selected:
    """`resume_job` for every paused job of `owner` carrying `selector`'s labels."""

    def resume(conn: sa.Connection, ids: list) -> int:
        state = sa.case((jobs.c.lease_token.is_(None), "scheduled"), else_="running")
        return len(
            conn.execute(
                jobs.update()
                .where(key_in(conn, jobs.c.job_id, ids), jobs.c.state == "paused")
                .values(state=state, updated_at=now)
                .returning(jobs.c.job_id)
            ).all()
        )

    return _for_selected(registry, owner, selector, resume)


def cancel_selected(registry: Registry, owner: str, selector: Mapping[str, str], now: datetime) -> Selected:
    """`cancel_job` for every live job of `owner` carrying `selector`'s labels."""

    def cancel(conn: sa.Connection, ids: list) -> int:
        cancelled = conn.execute(
            jobs.update()
            .where(key_in(conn, jobs.c.job_id, ids), jobs.c.state.in_(LIVE_STATES))
            .values(state="cancelled", next_run_at=None, updated_at=now)
            .returning(jobs.c.job_id, jobs.c.lease_token)
        ).all()
        if cancelled:
            conn.execute(_fail_claimed_runs(conn, [row.job_id for row in cancelled], now))
            _fail_unstarted(
                conn, [(row.job_id, row.lease_token) for row in cancelled if row.lease_token], now
            )
        return len(cancelled)

    return _for_selected(registry, owner, selector, cancel)


# --- the owner switch (app.services.owners) ------------------------------------------


def take_back_owner(registry: Registry, index: int, owner: str, now: datetime) -> tuple[int, int]:
    """What `punctual owners pause` takes back of `owner` on database `index`, in one
    transaction: its schedule runs claimed and not started (`_take_back`: the jobs are
    due again as they were), and its runs leased on their own rows and not started
    (off-schedule runs, an `allow` job's occurrences), which get a new lease token
    (their dispatch messages start nothing) and `published` false: they wait in the
    outbox, which the relay sweep does not publish for a paused owner, and the janitor
    does not take them back. Returns (schedule runs taken back, runs held). Job rows
    first, in key order, then runs, as everywhere."""
    engine = registry.engines[index]
    with engine.begin() as conn:
        leased = sa.select(jobs.c.job_id, jobs.c.lease_token).where(
            jobs.c.owner == owner, jobs.c.lease_token.isnot(None)
        )
        if is_postgres(conn):
            leased = leased.with_for_update()
        leases = conn.execute(served_only(registry, index, leased.order_by(jobs.c.job_id), jobs)).all()
        taken = _take_back(conn, [(row.job_id, row.lease_token) for row in leases], now)
        # Runs leased on their own rows (off-schedule, an `allow` job's): the only runs
        # whose row has a leased_until. The janitor passes a paused owner's by.
        waiting = runs.update().where(
            runs.c.owner == owner, runs.c.state == "claimed", runs.c.leased_until.isnot(None)
        )
        held = conn.execute(
            served_only(registry, index, waiting, runs)
            .values(lease_token=random_uuid(conn), published=False, updated_at=now)
            .returning(runs.c.run_id)
        ).all()
    return len(taken), len(held)


def renew_held_runs(registry: Registry, index: int, owner: str, now: datetime) -> int:
    """At `punctual owners resume`: every run of `owner` leased on its own row waiting to
    start on database `index` (held by the pause, or a retry made while it lasted) gets a
    lease from now, as long as a claimed run's (queued_lease_s), or keeps a longer one
    (a run a rate holds to a later instant), so the janitor does not take back what
    the relay sweep is about to publish. Returns how many."""
    fresh = now + timedelta(seconds=registry.settings.queued_lease_s)
    engine = registry.engines[index]
    with engine.begin() as conn:
        waiting = runs.update().where(
            runs.c.owner == owner,
            runs.c.state == "claimed",
            runs.c.leased_until.isnot(None),
            runs.c.published == sa.false(),
        )
        renewed = conn.execute(
            served_only(registry, index, waiting, runs)
            .values(
                leased_until=sa.case((runs.c.leased_until > fresh, runs.c.leased_until), else_=fresh),
                updated_at=now,
            )
            .returning(runs.c.run_id)
        ).all()
    return len(renewed)


def _fail_claimed_runs(conn: sa.Connection, job_ids: Sequence[uuid.UUID], now: datetime) -> sa.Update:
    """The jobs' runs not started yet fail ("job cancelled"); `published` true takes
    them out of the outbox: there is nothing left to send."""
    return (
        runs.update()
        .where(key_in(conn, runs.c.job_id, list(job_ids)), runs.c.state == "claimed")
        .values(state="failed", error="job cancelled", finished_at=now, updated_at=now, published=True)
    )


def _fail_unstarted(
    conn: sa.Connection, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], now: datetime
) -> None:
    """For cancelled jobs whose lease (job_id, lease_token) is held by a run claimed and
    not started, which has no row yet (app.pollers.claim): its row, `failed` ("job
    cancelled"), as `_fail_claimed_runs` leaves a claimed row's, and the lease released
    (its message, when it comes, starts nothing)."""
    tokens = dict(leases)
    if not tokens:
        return
    with_row = set(
        conn.execute(
            sa.select(runs.c.job_id).where(
                key_in(conn, runs.c.job_id, sorted(tokens)), runs.c.lease_token.in_(list(tokens.values()))
            )
        ).scalars()
    )
    unstarted = sorted(job_id for job_id in tokens if job_id not in with_row)
    if not unstarted:
        return
    found = conn.execute(sa.select(jobs).where(key_in(conn, jobs.c.job_id, unstarted))).mappings().all()
    for job in found:
        failed = run_row(
            job_id=job["job_id"],
            shard=job["shard"],
            owner=job["owner"],
            origin="schedule",
            scheduled_for=job["nominal_at"],
            attempt=job["attempt"] + 1,
            state="failed",
            target=job["target"],
            retry=retry_of(job).to_json(),
            now=now,
            lease_token=tokens[job["job_id"]],
            finished_at=now,
            error="job cancelled",
        )
        conn.execute(runs.insert().values(failed))
    _take_back(conn, [(job_id, tokens[job_id]) for job_id in unstarted], now)


def _for_selected(registry: Registry, owner: str, selector: Mapping[str, str], change) -> Selected:
    """Apply `change(conn, job_ids)` to the jobs of `owner` carrying `selector`'s
    labels, one transaction per database. The rows are locked in key order first, as
    a completion locks its jobs, so the two never deadlock; `change` answers how many
    it moved. A database that fails leaves the others' changes made: the verbs are
    idempotent, so the request is simply sent again."""
    matched = changed = 0
    for index, engine in enumerate(registry.engines):
        with engine.begin() as conn:
            query = (
                sa.select(jobs.c.job_id)
                .where(jobs.c.owner == owner, carries_labels(conn, jobs.c.labels, selector))
                .order_by(jobs.c.job_id)
            )
            if is_postgres(conn):
                query = query.with_for_update()
            ids = list(conn.execute(served_only(registry, index, query, jobs)).scalars())
            if ids:
                matched += len(ids)
                changed += change(conn, ids)
    return Selected(matched, changed)


def trigger_job(registry: Registry, owner: str, job_id: str, now: datetime) -> Row:
    """One extra run now, off-schedule: a `claimed` run row the relay sweep publishes.

    Neither the job's state nor its next_run_at changes. At most TRIGGERS_PER_WINDOW
    triggers of one job in any TRIGGER_WINDOW_S, paused or not (RateLimited): each is
    a call of the target, and the limit is counted in the registry, so it holds
    across API processes. The job row is locked (FOR UPDATE) so that concurrent
    triggers count one after the other, and a concurrent cancel either sees this run
    (and fails it) or wins first (and this is a Conflict):

    SELECT runs.created_at FROM runs WHERE runs.job_id = :job_id AND runs.created_at >
    :window_start AND runs.origin = 'trigger' AND runs.attempt = 1 ORDER BY
    runs.created_at DESC LIMIT :limit
    """
    engine, key = locate(registry, job_id)
    with engine.begin() as conn:
        row = select_job(conn, owner, key, lock=True)
        if row is None:
            raise NotFound("job")
        if row["state"] in FINAL_STATES:
            raise Conflict(f"the job is {row['state']}; it cannot be triggered")
        _within_trigger_limit(conn, key, now)
        return insert_run(
            conn,
            row,
            origin="trigger",
            scheduled_for=truncate_to_ms(now),
            now=now,
            lease_s=registry.settings.lease_s,
        )


def _within_trigger_limit(conn: sa.Connection, job_id: uuid.UUID, now: datetime) -> None:
    """RateLimited when the job was triggered TRIGGERS_PER_WINDOW times in the last
    TRIGGER_WINDOW_S (a range of ix_runs_job_created); Retry-After: when the oldest of
    them leaves the window."""
    window = timedelta(seconds=TRIGGER_WINDOW_S)
    recent = (
        conn.execute(
            sa.select(runs.c.created_at)
            .where(
                runs.c.job_id == job_id,
                runs.c.created_at > now - window,
                runs.c.origin == "trigger",
                runs.c.attempt == 1,  # a retry of a triggered run is not a trigger
            )
            .order_by(runs.c.created_at.desc())
            .limit(TRIGGERS_PER_WINDOW)
        )
        .scalars()
        .all()
    )
    if len(recent) >= TRIGGERS_PER_WINDOW:
        retry_after_s = max(1, math.ceil((recent[-1] + window - now).total_seconds()))
        raise RateLimited(
            f"a job may be triggered at most {TRIGGERS_PER_WINDOW} times in {TRIGGER_WINDOW_S} s;"
            f" try again in {retry_after_s} s",
            retry_after_s,
        )


def insert_run(
    conn: sa.Connection, job: Row, *, origin: str, scheduled_for: datetime, now: datetime, lease_s: float
) -> dict[str, Any]:
    """Insert an off-schedule run (trigger, replay; a backfill inserts its own in bulk):
    claimed, due now, with its own lease, the job's current target and retry policy,
    attempt 1 (a fresh retry budget)."""
    run = run_row(
        job_id=job["job_id"],
        shard=job["shard"],
        owner=job["owner"],
        origin=origin,
        scheduled_for=scheduled_for,
        attempt=1,
        state="claimed",
        target=job["target"],
        retry=retry_of(job).to_json(),
        now=now,
        lease_token=uuid.uuid4(),
        leased_until=now + timedelta(seconds=lease_s),
        due_at=now,
        published=False,
    )
    conn.execute(runs.insert().values(run))
    return run


# --- helpers -----------------------------------------------------------------------


def check_target_grant(settings: Settings, owner: str, target: Mapping[str, Any]) -> None:
    """A `postgres` target must name a database of PUNCTUAL_TARGET_DATABASES granted to
    the owner (PUNCTUAL_TARGET_DATABASE_OWNERS); one it was not granted is answered
    as one that does not exist, so an owner cannot probe the others' aliases."""
    if target.get("type") != "postgres":
        return
    database = settings.target_database(str(target.get("database")))
    if database is None or not database.granted(owner):
        raise ValidationError.single("target.database", "is not a target database granted to this owner")


def locate(registry: Registry, job_id: str | uuid.UUID) -> tuple[sa.Engine, uuid.UUID]:
    """The engine holding a job, and its id as a UUID; NotFound for a malformed id."""
    index, key = locate_index(registry, job_id)
    return registry.engines[index], key


def locate_index(registry: Registry, job_id: str | uuid.UUID) -> tuple[int, uuid.UUID]:
    """The DSN index holding a job, and its id as a UUID; NotFound for a malformed id."""
    try:
        key = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(job_id)
    except ValueError:
        raise NotFound("job") from None
    return registry.database_index(shard_for(key, registry.settings.shards)), key


def select_job(
    conn: sa.Connection, owner: str, job_id: uuid.UUID, *, lock: bool = False, share: bool = False
) -> Row | None:
    query = sa.select(jobs).where(jobs.c.job_id == job_id, jobs.c.owner == owner)
    if lock and is_postgres(conn):
        query = query.with_for_update(read=share)
    return conn.execute(query).mappings().first()


def _transition(
    conn: sa.Connection,
    owner: str,
    job_id: uuid.UUID,
    from_states: tuple[str, ...],
    to_state: Any,
    now: datetime,
    *,
    idempotent: tuple[str, ...],
    extra: dict[str, Any] | None = None,
) -> Row:
    """Move a job from one of `from_states` to `to_state` in one conditional UPDATE.

    When no row moves: a job already in one of the `idempotent` states is answered
    as it is; a missing one is NotFound; any other state is a Conflict.
    """
    row = (
        conn.execute(
            jobs.update()
            .where(jobs.c.job_id == job_id, jobs.c.owner == owner, jobs.c.state.in_(from_states))
            .values(state=to_state, updated_at=now, **(extra or {}))
            .returning(*jobs.c)
        )
        .mappings()
        .first()
    )
    if row is not None:
        return row
    current = select_job(conn, owner, job_id)
    if current is None:
        raise NotFound("job")
    if current["state"] in idempotent:
        return current
    raise Conflict(f"the job is {current['state']}")
