"""The worker's fenced writes before completion: start, hold, heartbeat.

Each takes a batch and writes it with one statement per physical DSN, fenced by the
lease token, so a duplicated or stale dispatch message changes nothing (invariants 1,
3, 4):

- start: a run leased on its job gets its row, `running`, while the job holds its
  token (app.pollers.claim writes none); one leased on its row goes claimed -> running.
  Only the runs it returns may be called, each with the lease of its call on its row.
- hold: a limit said "not yet", or a dead process never called (app.worker.orphans;
  fenced by its start's instant too). A schedule run's row, if any, is deleted (no
  attempt spent), its job `scheduled` again when the limit allows, misfire_exempt; an
  off-schedule run is `claimed` again under a new token, due then for the relay sweep.
- heartbeat: leased_until = now + lease_s on the run row while the call is in flight.

Each write is retried in place after a transient failure (app.registry.transient): all
three are fenced, so sending one again changes nothing the first one changed; the
start recognises the runs an earlier try of its own started (commit through, answer
lost) by their started_at, which is this start's `now` to the microsecond, and token.

During a shard move (app.registry.mover) a write refused by the move's fence (SQLSTATE
PT409) waits for the switch, bounded (LEASE_FENCE_WAIT_S for a start or hold, a
heartbeat interval for a heartbeat), and is written on the shard's new database, as a
completion is: a run is started on one database only, once. A start that tried a run
on the old database looks on the new one for its own start too.
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa

from app.lifecycle.message import DispatchRun
from app.registry.bulk import key_in, same_token, state_among, update_together
from app.registry.dialect import locks_rows
from app.registry.engines import LEASE_FENCE_WAIT_S, Registry, refuse_moved_shards, statement_connection
from app.registry.schema import jobs, runs
from app.registry.statements import HEARTBEAT_RUNS, START_NEW_RUNS, START_RUNS
from app.registry.transient import retrying


def _shard_of(run: DispatchRun) -> int:
    return run.shard


def start(registry: Registry, batch: Sequence[DispatchRun], now: datetime) -> set[uuid.UUID]:
    """Mark runs running, fenced; returns the run_ids that this call started.

    The start gives each run the lease of its call on its row (leased_until = now +
    lease_s): a run that waited in the broker for most of its job's lease must not be
    taken back by the janitor before its first heartbeat. The statements are
    _start_on's; a try after a transient failure, or on the database a move took
    the shard to, also takes as its own the runs an earlier try started (_started_at).
    """
    until = now + timedelta(seconds=registry.settings.lease_s)
    tried: set[uuid.UUID] = set()  # runs a try of this start was sent for, on any database

    def write(engine: sa.Engine, group: list[DispatchRun]) -> list:
        on_jobs = sorted(
            (_new_row(run, now) for run in group if not run.leased_on_run), key=lambda row: row["job_id"]
        )
        rows = [
            {
                "run_id": run.run_id,
                "lease_token": run.lease_token,
                "lateness_ms": int((now - run.scheduled_for).total_seconds() * 1000),
                "leased_until": until,
            }
            for run in group
            if run.leased_on_run
        ]
        # A try on the old database may have committed before the fence and lost its
        # answer: the move carried that start here.
        tried_elsewhere = any(run.run_id in tried for run in group)
        shards = {run.shard for run in group}
        tried.update(run.run_id for run in group)
        tries = itertools.count()
        return retrying(
            lambda: _start_on(
                engine, shards, on_jobs, rows, until, now, retried=tried_elsewhere or next(tries) > 0
            ),
            f"start of {len(group)} runs",
        )

    started: set[uuid.UUID] = set()
    for ids in registry.for_each_database(batch, _shard_of, write, fence_wait_s=LEASE_FENCE_WAIT_S):
        started.update(ids)
    return started


def _start_on(
    engine,
    shards: set[int],
    on_jobs: list[dict],
    rows: list[dict],
    until: datetime,
    now: datetime,
    retried: bool,
) -> list:
    """One try of a start on one DSN, one statement (app.registry.bulk.update_together:
    in autocommit, behind the move fence, refused if a move took these shards away,
    refuse_moved_shards): START_NEW_RUNS, the rows of runs leased on their jobs,
    written under the job's lease (its row locked FOR SHARE first: a claim not yet
    committed, a take-back or the janitor holding it is waited for), then START_RUNS
    (app.registry.statements). Job rows are locked before run rows, the janitor's lock
    order, so the two never deadlock.
    """
    with statement_connection(engine) as conn:
        inserted, updated = update_together(
            conn,
            [
                START_NEW_RUNS.of(
                    on_jobs,
                    {
                        "origin": "schedule",
                        "state": "running",
                        "leased_until": until,
                        "published": True,
                        "started_at": now,
                        "created_at": now,
                        "updated_at": now,
                    },
                ),
                START_RUNS.of(
                    sorted(rows, key=lambda row: row["run_id"]),
                    {"state": "running", "started_at": now, "updated_at": now},
                ),
            ],
            refuse_moved=shards,
        )
        ids = inserted + updated
        if retried:
            # The connection may have broken after an earlier try committed: the runs it
            # started carry this start's exact instant and the message's token.
            ids += _started_at(conn, on_jobs + rows, now)
    return ids


def _new_row(run: DispatchRun, now: datetime) -> dict:
    """The row START_NEW_RUNS writes for a run leased on its job (its constants aside)."""
    return {
        "run_id": run.run_id,
        "job_id": run.job_id,
        "lease_token": run.lease_token,
        "shard": run.shard,
        "owner": run.owner,
        "scheduled_for": run.scheduled_for,
        "attempt": run.attempt,
        "target": run.target,
        "retry": run.retry,
        "lateness_ms": int((now - run.scheduled_for).total_seconds() * 1000),
    }


def _started_at(conn: sa.Connection, rows: list[dict], now: datetime) -> list:
    return list(
        conn.execute(
            sa.select(runs.c.run_id).where(
                sa.tuple_(runs.c.run_id, runs.c.lease_token).in_(
                    [(r["run_id"], r["lease_token"]) for r in rows]
                ),
                state_among(runs.c.state, ("running",)),
                runs.c.started_at == now,
            )
        ).scalars()
    )


# A run is held back before its start (a rate) or after it, before its call (it
# waited its while for a concurrency slot): either way its call was never made.
_HOLDABLE = ("claimed", "running")


def hold(
    registry: Registry,
    held: Sequence[tuple[DispatchRun, datetime]],
    now: datetime,
    started: Mapping[uuid.UUID, datetime | None] | None = None,
) -> int:
    """Put runs a limit held back off until their retry time; returns how many were held.

    `started`: the runs of a dead process's roll (app.worker.orphans), each with the
    instant that process's start gave it. Its message went back to the broker, and
    another process may have started a run under the same token since (and called
    it): such a run, started at another instant, is left as it is. One started at
    that instant, or not started at all, is held back (as is any run whose instant
    is None: its roll did not say)."""

    def write(engine: sa.Engine, group: list[tuple[DispatchRun, datetime]]) -> int:
        until = {run.run_id: at for run, at in group}
        scheduled = [(run, at) for run, at in group if not run.leased_on_run]
        off = [(run, at) for run, at in group if run.leased_on_run]
        return retrying(
            functools.partial(
                _hold_on, engine, scheduled, off, until, now, registry.settings.lease_s, started
            ),
            f"hold of {len(group)} runs",
        )

    return sum(
        registry.for_each_database(held, lambda item: item[0].shard, write, fence_wait_s=LEASE_FENCE_WAIT_S)
    )


def _hold_on(
    engine: sa.Engine,
    scheduled: list[tuple[DispatchRun, datetime]],
    off: list[tuple[DispatchRun, datetime]],
    until: dict[uuid.UUID, datetime],
    now: datetime,
    lease_s: float,
    started: Mapping[uuid.UUID, datetime | None] | None,
) -> int:
    """One try of a hold on one database, refused first if a move took the shards away."""
    held = 0
    with engine.begin() as conn:
        refuse_moved_shards(conn, [run.shard for run, _ in scheduled + off])
        if scheduled:
            # Jobs are locked before runs, the janitor's and the completion's order.
            # By key alone: the release below is fenced by the token (app.registry.bulk
            # says why a token is not a condition here).
            lock = (
                sa.select(jobs.c.job_id)
                .where(key_in(conn, jobs.c.job_id, sorted({r.job_id for r, _ in scheduled})))
                .order_by(jobs.c.job_id)
            )
            if locks_rows(conn):
                conn.execute(lock.with_for_update()).all()
            if started is not None:
                # (A start writes a run leased on its job under that job's row, locked
                # FOR SHARE: with the job locked here, no start comes in between.)
                scheduled = _not_started_elsewhere(conn, scheduled, started)
        if scheduled:
            # A run held before its start has no row; one held after it (before its
            # call) has, and it goes: nothing happened.
            conn.execute(
                sa.delete(runs).where(
                    sa.tuple_(runs.c.run_id, runs.c.lease_token).in_(
                        [(r.run_id, r.lease_token) for r, _ in scheduled]
                    ),
                    state_among(runs.c.state, _HOLDABLE),
                )
            )
            for run, _ in sorted(scheduled, key=lambda item: item[0].job_id):
                released = conn.execute(
                    _RELEASE_JOB,
                    {
                        "b_job_id": run.job_id,
                        "b_token": run.lease_token,
                        "b_at": until[run.run_id],
                        "b_now": now,
                    },
                )
                held += released.rowcount
        for run, at in off:
            instant = None if started is None else started[run.run_id]
            fence = [] if instant is None else [_unstarted_or_started_at(instant)]
            result = conn.execute(
                sa.update(runs)
                .where(
                    runs.c.run_id == run.run_id,
                    runs.c.lease_token == run.lease_token,
                    state_among(runs.c.state, _HOLDABLE),
                    *fence,
                )
                .values(
                    state="claimed",
                    started_at=None,
                    lateness_ms=None,
                    lease_token=uuid.uuid4(),
                    due_at=at,
                    published=False,
                    updated_at=now,
                    leased_until=at + timedelta(seconds=lease_s),
                )
            )
            held += result.rowcount
    return held


def _unstarted_or_started_at(instant: datetime) -> sa.ColumnElement[bool]:
    return sa.or_(runs.c.started_at.is_(None), runs.c.started_at == instant)


def _not_started_elsewhere(
    conn: sa.Connection,
    scheduled: list[tuple[DispatchRun, datetime]],
    started: Mapping[uuid.UUID, datetime | None],
) -> list[tuple[DispatchRun, datetime]]:
    """The schedule runs of `scheduled` that have no row under their token, or one
    their start (`started`) wrote."""
    elsewhere = {
        row.run_id
        for row in conn.execute(
            sa.select(runs.c.run_id, runs.c.started_at).where(
                sa.tuple_(runs.c.run_id, runs.c.lease_token).in_(
                    [(r.run_id, r.lease_token) for r, _ in scheduled]
                )
            )
        )
        if row.started_at is not None and started[row.run_id] not in (None, row.started_at)
    }
    return [(run, at) for run, at in scheduled if run.run_id not in elsewhere]


# A held job is due again when the limit allows; paused and cancelled jobs keep
# their state, and a cancelled job keeps next_run_at null.
_RELEASE_JOB = (
    sa.update(jobs)
    .where(jobs.c.job_id == sa.bindparam("b_job_id"), same_token(jobs.c.lease_token, sa.bindparam("b_token")))
    .values(
        state=sa.case((jobs.c.state == "running", "scheduled"), else_=jobs.c.state),
        next_run_at=sa.case((jobs.c.state == "cancelled", jobs.c.next_run_at), else_=sa.bindparam("b_at")),
        misfire_exempt=True,
        lease_token=None,
        leased_until=None,
        updated_at=sa.bindparam("b_now"),
    )
)


def heartbeat(registry: Registry, batch: Sequence[DispatchRun], now: datetime) -> set[uuid.UUID]:
    """Extend the leases of runs whose calls are in flight (fenced; a lost lease stays
    lost). Returns the run_ids whose lease was extended: a run not among them lost its
    lease (the janitor took it back), and its call must not start any more. The
    statements are _heartbeat_on's."""
    until = {"leased_until": now + timedelta(seconds=registry.settings.lease_s)}
    # A beat that cannot get through before the next one is due is left to that one.
    budget_s = registry.settings.heartbeat_s

    def write(engine: sa.Engine, group: list[DispatchRun]) -> set[uuid.UUID]:
        # Every started run holds the lease of its call on its row (start).
        on_runs = sorted(
            ({"run_id": r.run_id, "lease_token": r.lease_token} for r in group), key=lambda row: row["run_id"]
        )
        beat = functools.partial(_heartbeat_on, engine, {r.shard for r in group}, on_runs, until)
        return set(retrying(beat, f"heartbeat of {len(group)} runs", budget_s=budget_s))

    kept: set[uuid.UUID] = set()
    for ids in registry.for_each_database(batch, _shard_of, write, fence_wait_s=budget_s):
        kept.update(ids)
    return kept


def _heartbeat_on(engine, shards: set[int], on_runs: list[dict], until: dict) -> list:
    """One try of a heartbeat on one DSN, one statement behind the move fence (as
    _start_on's): HEARTBEAT_RUNS (app.registry.statements), returning the runs whose
    leases it extended. The rows are locked in key order first
    (bulk.locked_in_key_order): a heartbeat covers the runs whose calls ended and whose
    completion is being written, and the completion locks their rows in key order too.
    In the order of its plan, a heartbeat deadlocked with it.
    """
    with statement_connection(engine) as conn:
        [run_ids] = update_together(conn, [HEARTBEAT_RUNS.of(on_runs, until)], refuse_moved=shards)
    return run_ids
