"""Run service: a job's history, the owner's dead letters, and replay.

A run row lives on its job's shard. History is one job's runs, newest first by
(created_at, run_id); dead letters are the owner's `dead` runs merged over every
DSN. Replay follows docs/design.md ("API verbs"): the dead run becomes
`replayed` and is fired again with a fresh retry budget and the same scheduled_for
(so the same idempotency key). Lock order as in app.services.jobs: job row, then run row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

import sqlalchemy as sa

from app.core.errors import ValidationError
from app.registry.engines import Registry
from app.registry.estimates import counts_by_state
from app.registry.records import Row
from app.registry.schema import RUN_ORIGINS, jobs, runs
from app.services.errors import Conflict, NotFound
from app.services.jobs import insert_run, locate_index, select_job, served_only
from app.services.pagination import Page, decode_cursor, merge_newest, newest_first


def list_runs(
    registry: Registry,
    owner: str,
    job_id: str,
    *,
    limit: int,
    cursor: str | None,
    origin: str | None = None,
) -> Page:
    """A job's runs, newest first (with `origin`, only the runs of that origin);
    NotFound for another owner's job."""
    if origin is not None and origin not in RUN_ORIGINS:
        raise ValidationError.single("origin", f"must be one of {', '.join(RUN_ORIGINS)}")
    position = decode_cursor("r", cursor)
    index, key = locate_index(registry, job_id)
    selected = sa.select(runs).where(runs.c.job_id == key, runs.c.owner == owner)
    if origin is not None:
        selected = selected.where(runs.c.origin == origin)
    query = newest_first(
        selected,
        runs.c.created_at,
        runs.c.run_id,
        position,
        limit,
    )

    def history(conn: sa.Connection) -> list | None:
        owned = sa.select(jobs.c.job_id).where(jobs.c.job_id == key, jobs.c.owner == owner)
        if conn.execute(owned).first() is None:
            return None
        return list(conn.execute(query).mappings())

    # A replica read (docs/api.md "Replica reads"); a job the replica does not have yet
    # is looked for on the primary, so a job just created never answers 404 here.
    rows = registry.read(index, history, confirm=lambda found: found is not None)
    if rows is None:
        raise NotFound("job")
    return merge_newest("r", [rows], limit, "created_at", "run_id")


def list_dead_letters(registry: Registry, owner: str, *, limit: int, cursor: str | None) -> Page:
    """The owner's runs in state `dead`, newest first, over every DSN, each with its
    job's name as `job_name` (read by key on the run's DSN: a job lives with its runs)."""
    position = decode_cursor("d", cursor)
    query = newest_first(
        sa.select(runs).where(runs.c.owner == owner, runs.c.state == "dead"),
        runs.c.created_at,
        runs.c.run_id,
        position,
        limit,
    )

    def page(index: int) -> Callable[[sa.Connection], list]:
        return lambda conn: named(conn, index)

    def named(conn: sa.Connection, index: int) -> list:
        rows = list(conn.execute(served_only(registry, index, query, runs)).mappings())
        wanted = {row["job_id"] for row in rows}
        names: dict = {}
        if wanted:
            query_names = sa.select(jobs.c.job_id, jobs.c.name).where(jobs.c.job_id.in_(wanted))
            names = {job_id: name for job_id, name in conn.execute(query_names)}
        return [{**row, "job_name": names.get(row["job_id"])} for row in rows]

    pages = [  # replica reads (docs/api.md "Replica reads")
        registry.read(index, page(index)) for index in range(len(registry.engines))
    ]
    return merge_newest("d", pages, limit, "created_at", "run_id")


def count_dead(registry: Registry) -> int:
    """Runs in state `dead` over every database (operator metrics; not owner-scoped):
    exact while the table is small, an estimate once it is big (app.registry.estimates)."""
    total = 0
    for index in range(len(registry.engines)):
        total += registry.read(index, lambda conn: counts_by_state(conn, runs, ("dead",))).get("dead", 0)
    return total


def replay_run(registry: Registry, owner: str, run_id: str, now: datetime) -> Row:
    """Fire a dead run again; answers the run, now `replayed`.

    A dead one-off job whose schedule run died goes back to `scheduled` (due now,
    nominal_at = the run's scheduled_for, misfire-exempt) and the poller claims it;
    otherwise a new off-schedule run (origin `replay`) is inserted for the relay.
    Conflict when the run is not dead, or its job was cancelled (no new run starts
    for a cancelled job). NotFound for another owner's run.
    """
    try:
        key = uuid.UUID(run_id)
    except ValueError:
        raise NotFound("run") from None
    found = _find_run(registry, owner, key)
    if found is None:
        raise NotFound("run")
    engine, job_id = found
    with engine.begin() as conn:
        job = select_job(conn, owner, job_id, lock=True)
        run = conn.execute(_run_query(owner, key).with_for_update()).mappings().first()
        if job is None or run is None:
            raise NotFound("run")
        if run["state"] != "dead":
            raise Conflict(f"the run is {run['state']}; only a dead run can be replayed")
        if job["state"] == "cancelled":
            raise Conflict("the run's job is cancelled; no new run starts for it")
        replayed = (
            conn.execute(
                runs.update()
                .where(runs.c.run_id == key, runs.c.state == "dead")
                .values(state="replayed", updated_at=now)
                .returning(*runs.c)
            )
            .mappings()
            .one()
        )
        if job["schedule_kind"] == "once" and job["state"] == "dead" and run["origin"] == "schedule":
            conn.execute(
                jobs.update()
                .where(jobs.c.job_id == job_id, jobs.c.state == "dead")
                .values(
                    state="scheduled",
                    next_run_at=now,
                    nominal_at=run["scheduled_for"],
                    attempt=0,
                    misfire_exempt=True,
                    updated_at=now,
                )
            )
        else:
            insert_run(
                conn,
                job,
                origin="replay",
                scheduled_for=run["scheduled_for"],
                now=now,
                lease_s=registry.settings.lease_s,
            )
    return replayed


def _run_query(owner: str, run_id: uuid.UUID) -> sa.Select:
    return sa.select(runs).where(runs.c.run_id == run_id, runs.c.owner == owner)


def _find_run(registry: Registry, owner: str, run_id: uuid.UUID) -> tuple[sa.Engine, uuid.UUID] | None:
    """Which DSN holds a run (run ids are random: each DSN is asked by primary key)."""
    for index, engine in enumerate(registry.engines):
        query = sa.select(runs.c.job_id).where(runs.c.run_id == run_id, runs.c.owner == owner)
        with engine.connect() as conn:
            job_id = conn.execute(served_only(registry, index, query, runs)).scalar()
        if job_id is not None:
            return engine, job_id
    return None
