"""The janitor: leases that passed leased_until are taken back (docs/design.md, "expire").

A lease expires when its worker died or stalled: the call may or may not have
reached the target, so the attempt counts as spent. The janitor settles it like a
retryable failure ("lease expired") that retries at once: the run becomes `failed`
and the job is due again now with attempt + 1 and misfire_exempt; with attempts
exhausted the run is `dead` and the job moves on as after a dead run. A worker that
comes back later finds its token gone: its completion changes nothing (invariant 1).

Two scans per shard, each an index range scan in batches with FOR UPDATE SKIP
LOCKED so that two janitors share the work: jobs by ix_jobs_leased (a schedule run
holds its job's lease from its claim to its start), runs by ix_runs_leased (every
started run holds the lease of its call on its row; triggered, replayed and
backfilled runs, and an `allow` job's occurrences, hold one there from their claim).
A job whose lease passed with no run started under it was never called: its lease is
released, no attempt spent, and the occurrence is due again at once.

`expire_now` takes back, before they pass, the leases of the runs a dead worker
process may have called (app.worker.orphans), settled the same way.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from datetime import datetime

import sqlalchemy as sa

from app import metrics
from app.core.retries import CallOutcome
from app.lifecycle.completion import Finished, apply
from app.lifecycle.message import DispatchRun
from app.lifecycle.settlement import LEASE_EXPIRED
from app.registry.bulk import same_token, state_among
from app.registry.dialect import locks_rows
from app.registry.engines import LEASE_FENCE_WAIT_S, Registry, refuse_moved_shards
from app.registry.schema import jobs, runs
from app.registry.statements import EXPIRE_RUNS
from app.registry.transient import retrying
from app.settings import Settings

BATCH = 500
EXPIRED = CallOutcome(error=LEASE_EXPIRED, retryable_error=True)


def expired_jobs(shard: int, now: datetime, limit: int, lock: bool = True) -> sa.Select:
    """Job leases that passed, but those a run started under (its row holds the lease
    of its call, which the run scan takes back when it passes)."""
    started = sa.exists().where(
        runs.c.job_id == jobs.c.job_id,
        runs.c.lease_token == jobs.c.lease_token,
        runs.c.state == "running",
    )
    stmt = (
        sa.select(jobs.c.job_id, jobs.c.lease_token)
        .where(jobs.c.shard == shard, jobs.c.lease_token.isnot(None), jobs.c.leased_until < now, ~started)
        .order_by(jobs.c.leased_until)
        .limit(limit)
    )
    return stmt.with_for_update(of=jobs, skip_locked=True) if lock else stmt


def expired_runs(
    shard: int, now: datetime, limit: int, lock: bool = True, held: Collection[str] = ()
) -> sa.Select:
    """Runs whose lease on their row passed (every started run; off-schedule runs and
    an `allow` job's occurrences waiting to start), but the runs of the `held` owners
    (paused) that wait to start: they wait for the resume, which renews their leases.
    With their job's token (`job_lease_token`): a run whose job holds its token is
    leased on its job too, and settling it settles the job."""
    stmt = (
        _runs_with_job_token()
        .where(
            runs.c.shard == shard,
            runs.c.state.in_(("claimed", "running")),
            runs.c.leased_until < now,
        )
        .order_by(runs.c.leased_until)
        .limit(limit)
    )
    if held:
        stmt = stmt.where(sa.not_(sa.and_(runs.c.state == "claimed", runs.c.owner.in_(sorted(held)))))
    return stmt.with_for_update(of=runs, skip_locked=True) if lock else stmt


def _runs_with_job_token() -> sa.Select:
    """Run rows, each with its job's lease token (`job_lease_token`, for `_own_lease`)."""
    return sa.select(runs, jobs.c.lease_token.label("job_lease_token")).select_from(
        runs.outerjoin(jobs, jobs.c.job_id == runs.c.job_id)
    )


def expire(
    engine: sa.Engine,
    shard: int,
    now: datetime,
    settings: Settings,
    rand: Callable[[], float] = random.random,
    held: Collection[str] = (),
) -> int:
    """Take back every expired lease of `shard` (but the waiting runs of the `held`
    owners: paused); returns how many runs were settled or released."""
    lock = locks_rows(engine)
    total = 0
    scans = (_expire_job_leases, functools.partial(_expire_run_leases, held=held))
    for scan in scans:
        while True:
            with engine.begin() as conn:
                settled, full = scan(conn, shard, now, settings, rand, lock)
            total += settled
            if not full:
                break
    if total:
        metrics.LEASES_EXPIRED.labels(str(shard)).inc(total)
    return total


def _expire_job_leases(conn, shard, now, settings, rand, lock) -> tuple[int, bool]:
    leases = conn.execute(expired_jobs(shard, now, BATCH, lock)).all()
    if not leases:
        return 0, False
    tokens = {row.job_id: row.lease_token for row in leases}
    rows = (
        conn.execute(
            sa.select(runs).where(
                runs.c.job_id.in_(list(tokens)),
                state_among(runs.c.state, ("claimed", "running")),
                runs.c.origin == "schedule",
            )
        )
        .mappings()
        .all()
    )
    owned = [row for row in rows if tokens.get(row["job_id"]) == row["lease_token"]]
    # A run that started after this scan's snapshot holds the lease of its call: the
    # run scan's, when it passes.
    live = {row["job_id"] for row in owned if row["state"] == "running" and row["leased_until"] is not None}
    owned = [row for row in owned if row["job_id"] not in live]
    settled = _settle(conn, owned, now, settings, rand)
    # A lease with no run left behind (never started: nothing to settle) is released.
    orphaned = set(tokens) - {row["job_id"] for row in owned} - live
    for job_id in sorted(orphaned):
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.job_id == job_id, same_token(jobs.c.lease_token, tokens[job_id]))
            .values(
                state=sa.case((jobs.c.state == "running", "scheduled"), else_=jobs.c.state),
                lease_token=None,
                leased_until=None,
                misfire_exempt=True,
                updated_at=now,
            )
        )
    return settled + len(orphaned), len(leases) >= BATCH


def _expire_run_leases(conn, shard, now, settings, rand, lock, held=()) -> tuple[int, bool]:
    rows = conn.execute(expired_runs(shard, now, BATCH, lock, held)).mappings().all()
    return _settle(conn, rows, now, settings, rand), len(rows) >= BATCH


def _own_lease(row) -> bool | None:
    """Whether a run row of the run scan holds a lease of its own (None: as the row
    says, for the job scan's, which their job leases)."""
    if "job_lease_token" not in row:
        return None
    return not (row["origin"] == "schedule" and row["job_lease_token"] == row["lease_token"])


def _settle(conn, rows, now, settings, rand) -> int:
    if not rows:
        return 0
    batch = [
        Finished(DispatchRun.from_row(row, None, own_lease=_own_lease(row)), EXPIRED, now) for row in rows
    ]
    report = apply(conn, batch, now, rand, settings.lease_s, runs_write=EXPIRE_RUNS, retry_now=True)
    return report.applied


def expire_now(registry: Registry, taken: Sequence[DispatchRun], now: datetime) -> int:
    """Take back now the leases of the `taken` runs that are still `running` under
    their tokens, as if they had passed: a dead worker process's runs whose calls may
    have gone out (app.worker.orphans). Each is settled "lease expired", an attempt
    spent, and is due again at once; returns how many were settled."""

    def write(engine: sa.Engine, group: list[DispatchRun]) -> int:
        return retrying(
            functools.partial(_expire_now_on, engine, group, now, registry.settings),
            f"expiry of {len(group)} leases",
        )

    settled = registry.for_each_database(taken, lambda run: run.shard, write, fence_wait_s=LEASE_FENCE_WAIT_S)
    return sum(settled)


def _expire_now_on(engine: sa.Engine, group: list[DispatchRun], now: datetime, settings: Settings) -> int:
    """One try of `expire_now` on one database, refused first if a move took the shards away."""
    keys = [(run.run_id, run.lease_token) for run in group]
    stmt = (
        _runs_with_job_token()
        .where(sa.tuple_(runs.c.run_id, runs.c.lease_token).in_(keys), runs.c.state == "running")
        .order_by(runs.c.run_id)
    )
    with engine.begin() as conn:
        refuse_moved_shards(conn, sorted({run.shard for run in group}))
        if locks_rows(engine):  # (a row being settled meanwhile is that writer's)
            stmt = stmt.with_for_update(of=runs, skip_locked=True)
        rows = conn.execute(stmt).mappings().all()
        settled = _settle(conn, rows, now, settings, random.random)
    for shard, count in Counter(row["shard"] for row in rows).items():
        metrics.LEASES_EXPIRED.labels(str(shard)).inc(count)
    return settled
