"""The claim: due jobs of one shard become runs, one transaction per batch.

The claim is fair between owners (docs/design.md "The fair claim"): one owner's
backlog does not make another owner's due rows wait. It is two statements:
`due_owners`, the owners of the shard with due rows and each one's oldest due instant,
by a loose index scan of ix_jobs_due_by_owner (one probe per owner, however many rows
each has); then `fair_due_jobs`, each owner's share of the batch (app.pollers.shares:
weighted round-robin), a range scan of the same index per owner, FOR UPDATE SKIP
LOCKED. With one owner due it is `due_jobs`, a range scan of ix_jobs_due (invariant 5).

In the same transaction every row gets its plan (app.pollers.plan, misfires included)
and the writes are batched (app.registry.statements): the claimed jobs (running, a new
lease_token, leased_until = fire instant + queued_lease_s), the jobs whose misfire ran
nothing, and the rows that must exist before a start (skipped occurrences, an `allow`
job's runs); a run leased on its job gets its row at its start (app.lifecycle.lease).
The messages are published before the COMMIT (`send`): no outbox row, no published mark
(docs/design.md "Writes per run").

Claiming ahead: a job is claimed up to PUNCTUAL_CLAIM_AHEAD_S before its fire instant,
its run travels with that instant (DispatchRun.fire_at) and starts then, not before;
such a run is on time, so its plan is made as at its fire instant.

Two pollers (or two beats) on one shard never double-fire: SKIP LOCKED hands each row
to one transaction, which leaves it no longer 'scheduled' (invariant 4). SQLite
(embedded mode) has no FOR UPDATE; it has one poller and locks at BEGIN.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from app import metrics, tracing
from app.core.misfire import skip_reason
from app.lifecycle.message import DispatchRun
from app.pollers.plan import ClaimPlan, plan_claim
from app.pollers.relay import Send, send_all
from app.pollers.shares import fair_shares
from app.registry.dialect import is_postgres, locks_rows
from app.registry.records import Row, retry_of, run_row
from app.registry.schema import DUE_INDEX_BOUND, jobs
from app.registry.statements import CLAIM_JOBS, INSERT_RUNS, MOVE_JOBS, PASS_JOBS
from app.settings import Settings


def due_jobs(shard: int, horizon: datetime, limit: int, lock: bool = True) -> sa.Select:
    """The claim query: the oldest rows of one shard due by `horizon` (now + the
    claim-ahead window), locked, skipping locked ones."""
    return _due_jobs_statement(lock).params(shard=shard, horizon=horizon, limit=limit)


# What a claim reads of a job row: all but what only the API shows (the labels and the
# key: a JSON document to decode per row, which no claim uses).
_CLAIM_READS = [column for column in jobs.c if column.name not in ("labels", "job_key")]


# The claim's statements are built once, their values bound at each execution: a
# poll tick runs them every batch, and building a statement (and its cache key) anew
# each time was a few per cent of the worker's CPU on a burst.
@functools.cache
def _due_jobs_statement(lock: bool) -> sa.Select:
    stmt = (
        sa.select(*_CLAIM_READS)
        .where(
            jobs.c.shard == sa.bindparam("shard"),
            jobs.c.state == "scheduled",
            # ix_jobs_due's own bound (true of every row): only a query that states it
            # can use that index (app.registry.schema, migration 0007).
            jobs.c.next_run_at > DUE_INDEX_BOUND,
            jobs.c.next_run_at <= sa.bindparam("horizon"),
        )
        .order_by(jobs.c.next_run_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    return stmt.with_for_update(skip_locked=True) if lock else stmt


# A claimed run waits in the broker for up to QUEUED_LEASES leases before the janitor
# takes it back. It has not been called (a start comes before every call), so taking
# it back early would only send it again behind itself under a long backlog: a
# 100,000-run burst on a 2-core box keeps runs queued for minutes. Once it starts, its
# lease is PUNCTUAL_LEASE_S, renewed by the heartbeat. A message whose worker died is
# handed on by the broker (acks_late), and a dispatch that cannot reach the registry
# gives its message back, so this lease only covers a message the broker itself lost.
# (QUEUED_LEASES is in app.settings: a backfill's runs, which the API writes, wait as long.)


def queued_lease_s(settings: Settings) -> float:
    """How long a claimed run may wait to start (from its fire instant) before its
    lease expires: QUEUED_LEASES x PUNCTUAL_LEASE_S (600 s with the default 20 s)."""
    return settings.queued_lease_s


def due_owners(shard: int, horizon: datetime) -> sa.Select:
    """The owners of `shard` with rows due by `horizon`, each with its oldest due
    instant: a loose index scan (one probe of ix_jobs_due_by_owner per owner of the
    shard, due or not). PostgreSQL; SQLite groups instead (`_due_owners_grouped`)."""
    return _due_owners_statement().params(shard=shard, horizon=horizon)


@functools.cache
def _due_owners_statement() -> sa.Select:
    scheduled = (jobs.c.shard == sa.bindparam("shard"), jobs.c.state == "scheduled")
    first = (
        sa.select(jobs.c.owner, jobs.c.next_run_at)
        .where(*scheduled)
        .order_by(jobs.c.owner, jobs.c.next_run_at)
        .limit(1)
    )
    found = first.cte("due_owners", recursive=True)
    following = (
        sa.select(jobs.c.owner, jobs.c.next_run_at)
        .where(*scheduled, jobs.c.owner > found.c.owner)
        .order_by(jobs.c.owner, jobs.c.next_run_at)
        .limit(1)
        .lateral("next")
    )
    found = found.union_all(
        sa.select(following.c.owner, following.c.next_run_at).select_from(found).join(following, sa.true())
    )
    return sa.select(found.c.owner, found.c.next_run_at).where(
        found.c.next_run_at <= sa.bindparam("horizon", type_=jobs.c.next_run_at.type)
    )


def _due_owners_grouped(shard: int, horizon: datetime) -> sa.Select:
    """`due_owners` where there is no LATERAL (SQLite, one process, a small registry)."""
    return (
        sa.select(jobs.c.owner, sa.func.min(jobs.c.next_run_at).label("next_run_at"))
        .where(jobs.c.shard == shard, jobs.c.state == "scheduled", jobs.c.next_run_at <= horizon)
        .group_by(jobs.c.owner)
    )


def fair_due_jobs(
    shard: int, horizon: datetime, shares: Sequence[tuple[str, int]], lock: bool = True
) -> sa.Select:
    """The fair claim query (PostgreSQL): each owner's oldest due rows, at most its
    share, locked, skipping locked ones; one range scan of ix_jobs_due_by_owner each."""
    share = (
        sa.func.unnest(
            sa.literal([owner for owner, _ in shares], postgresql.ARRAY(sa.Text)),
            sa.literal([take for _, take in shares], postgresql.ARRAY(sa.Integer)),
        )
        .table_valued("owner", "take")
        .render_derived("share")
    )
    per_owner = (
        sa.select(*_CLAIM_READS)
        .where(
            jobs.c.shard == shard,
            jobs.c.state == "scheduled",
            jobs.c.owner == share.c.owner,
            jobs.c.next_run_at <= horizon,
        )
        .order_by(jobs.c.next_run_at)
        .limit(share.c.take)
    )
    if lock:
        per_owner = per_owner.with_for_update(skip_locked=True)
    due = per_owner.lateral("due")
    return sa.select(due).select_from(share).join(due, sa.true())


# Per (database, shard): where the owners' turns ended in this process's last batch;
# the next batch starts after it (app.pollers.shares). Only a
# fairness hint: another process, or a restart, starts the turns elsewhere.
_last_served: dict[tuple[str, int], str] = {}


def _select_due(
    conn: sa.Connection,
    shard: int,
    horizon: datetime,
    limit: int,
    lock: bool,
    weights: Mapping[str, int],
    paused: Collection[str] = (),
) -> tuple[Sequence[Row], bool]:
    """The due rows this batch takes, fairly between owners (none of a paused
    owner's), and whether more may be due (the batch, or some owner's share, came
    back full)."""
    bound = {"shard": shard, "horizon": horizon}
    if is_postgres(conn):
        found = conn.execute(_due_owners_statement(), bound).scalars().all()
    else:
        found = conn.execute(_due_owners_grouped(shard, horizon)).scalars().all()
    if paused and any(owner in paused for owner in found):
        # The plain range scan would take their rows too: the others take their shares.
        found = [owner for owner in found if owner not in paused]
        if not found:
            return [], False
    elif len(found) <= 1:  # one owner: the whole batch is its share, the plain range scan
        if not found:
            return [], False
        rows = conn.execute(_due_jobs_statement(lock), {**bound, "limit": limit}).mappings().all()
        return rows, len(rows) >= limit
    turns = (conn.engine.url.render_as_string(), shard)
    shares, turn_ends = fair_shares(found, weights, limit, after=_last_served.get(turns))
    if turn_ends is not None:
        _last_served[turns] = turn_ends
    if is_postgres(conn):
        rows = conn.execute(fair_due_jobs(shard, horizon, shares, lock)).mappings().all()
    else:
        rows = [
            row
            for owner, take in shares
            for row in conn.execute(
                due_jobs(shard, horizon, take, lock).where(jobs.c.owner == owner)
            ).mappings()
        ]
    taken: dict[str, int] = {}
    for row in rows:
        taken[row["owner"]] = taken.get(row["owner"], 0) + 1
    full = (
        len(rows) >= limit
        or len(shares) < len(found)
        or any(taken.get(owner, 0) >= take for owner, take in shares)
    )
    return rows, full


def relay_grace_s(settings: Settings) -> float:
    """How long a claimed run may wait for the claim's own publish before the relay
    sweep publishes it: long enough not to race the normal path, well inside the lease
    so a run lost between commit and publish still starts on its first attempt."""
    return min(5.0, settings.lease_s / 3)


@dataclass(frozen=True)
class ClaimResult:
    runs: list[DispatchRun]  # to publish
    taken: int  # due rows this batch took (claimed or moved on)
    full: bool  # the batch, or an owner's share of it, was full: more may be due

    @property
    def empty(self) -> bool:
        return self.taken == 0


def claim_batch(
    engine: sa.Engine,
    shard: int,
    now: datetime,
    settings: Settings,
    limit: int | None = None,
    weights: Mapping[str, int] | None = None,
    paused: Collection[str] = (),
    send: Send | None = None,
) -> ClaimResult:
    """Claim at most `limit` (settings.claim_batch) jobs of `shard` due by now +
    settings.claim_ahead_s, fairly between owners (`weights`: the owners whose weight is
    not 1; `paused`: owners none of whose rows is claimed), publish the runs with `send`
    (once: a failure rolls the claim back) and commit. Without `send` the caller
    publishes the returned runs (tests): those with a row wait in the outbox for the
    relay sweep meanwhile, the others have only their messages. After the
    SELECTs (`due_owners`, `fair_due_jobs`), the batch is written with
    app.registry.statements' CLAIM_JOBS, PASS_JOBS, MOVE_JOBS and INSERT_RUNS.
    """
    limit = limit or settings.claim_batch
    spans = tracing.spans()
    began_ns = time.time_ns() if spans is not None else 0
    lock = locks_rows(engine)
    horizon = now + timedelta(seconds=settings.claim_ahead_s)
    lease = timedelta(seconds=queued_lease_s(settings))
    due_at = now + timedelta(seconds=relay_grace_s(settings))
    claimed: list[dict] = []
    passed: list[dict] = []
    moved: list[dict] = []
    new_runs: list[dict] = []
    to_publish: list[DispatchRun] = []
    skipped_count = 0
    with engine.begin() as conn:
        rows, full = _select_due(conn, shard, horizon, limit, lock, weights or {}, paused)
        for job in rows:
            plan = plan_claim(job, now, settings.misfire_grace_s)
            new_runs.extend(_skipped_rows(job, plan, now, settings.misfire_grace_s))
            skipped_count += len(plan.skipped) + plan.unrecorded_skips
            if plan.run is None:
                moved.append(_move_params(job, plan))
                continue
            token = uuid.uuid4()
            ahead = plan.run.fire_at > now
            # The lease runs from the fire instant: a run claimed ahead waits for it.
            leased_until = max(now, plan.run.fire_at) + lease
            if plan.own_lease:
                params, run_row = _passed_params(job, plan, token, leased_until, now, due_at)
                run_row["published"] = send is not None
                passed.append(params)
                new_runs.append(run_row)
            else:  # its row is its start's to write
                params, run_row = _claim_params(job, plan, token, leased_until, now)
                claimed.append(params)
            to_publish.append(
                DispatchRun.from_row(
                    run_row,
                    job["payload"],
                    plan.run.fire_at if ahead else None,
                    recurring=job["schedule_kind"] != "once",
                )
            )
        CLAIM_JOBS.update(conn, claimed, {"state": "running", "updated_at": now})
        PASS_JOBS.update(conn, passed, {"attempt": 0, "misfire_exempt": False, "updated_at": now})
        MOVE_JOBS.update(
            conn,
            moved,
            {
                "attempt": 0,
                "misfire_exempt": False,
                "skipped_after": None,
                "skipped_through": None,
                "updated_at": now,
            },
        )
        INSERT_RUNS.insert(conn, new_runs)
        if send is not None and to_publish:
            # Before the COMMIT (the module's docstring); retried whole by the poll.
            send_all(shard, to_publish, send, retry=False)
    if spans is not None:
        spans.claimed(to_publish, began_ns, time.time_ns(), "claim")
    metrics.CLAIM_BATCH_SIZE.observe(len(rows))
    if rows:
        metrics.CLAIM_BATCHES.labels(str(shard)).inc()
        metrics.CLAIMS.labels(str(shard)).inc(len(to_publish))
        metrics.count_by_owner("claimed", (run.owner for run in to_publish))
    if skipped_count:
        metrics.RUNS.labels("skipped").inc(skipped_count)
    return ClaimResult(runs=to_publish, taken=len(rows), full=full)


def _claim_params(
    job: Row, plan: ClaimPlan, token: uuid.UUID, leased_until: datetime, now: datetime
) -> tuple[dict, dict]:
    assert plan.run is not None  # only a plan that runs something is claimed
    skipped_after: datetime | None
    skipped_through: datetime | None
    if plan.skipped_range is not None:
        skipped_after, skipped_through = plan.skipped_range
    elif plan.clear_skipped_range:
        skipped_after = skipped_through = None
    else:
        skipped_after, skipped_through = job["skipped_after"], job["skipped_through"]
    params = {
        "job_id": job["job_id"],
        "lease_token": token,
        "leased_until": leased_until,
        "nominal_at": plan.run.nominal,
        "next_run_at": plan.run.fire_at,
        "attempt": plan.attempt - 1,
        "skipped_after": skipped_after,
        "skipped_through": skipped_through,
    }
    run_row = _run_row(job, plan.run.nominal, plan.attempt, "claimed", now)
    run_row.update(lease_token=token)  # (not written: the message's)
    return params, run_row


def _passed_params(
    job: Row, plan: ClaimPlan, token: uuid.UUID, leased_until: datetime, now: datetime, due_at: datetime
) -> tuple[dict, dict]:
    """An `allow` job's claim: its run leased on its own row, the job moved past it."""
    assert plan.run is not None  # only a plan that runs something is claimed
    after, through = plan.skipped_range or (None, None)
    params = {**_move_params(job, plan), "skipped_after": after, "skipped_through": through}
    run_row = _run_row(job, plan.run.nominal, plan.attempt, "claimed", now)
    run_row.update(lease_token=token, leased_until=leased_until, due_at=due_at, published=False)
    return params, run_row


def _move_params(job: Row, plan: ClaimPlan) -> dict:
    moved_to = plan.moved_to  # None: the schedule is over
    return {
        "job_id": job["job_id"],
        "state": "completed" if moved_to is None else "scheduled",
        "nominal_at": job["nominal_at"] if moved_to is None else moved_to.nominal,
        "next_run_at": None if moved_to is None else moved_to.fire_at,
    }


def _skipped_rows(job: Row, plan: ClaimPlan, now: datetime, grace_s: float) -> list[dict]:
    rows = []
    for skipped in plan.skipped:
        row = _run_row(job, skipped.nominal, 1, "skipped", now)
        row.update(published=True, finished_at=now, error=skip_reason(job["misfire"], skipped, now, grace_s))
        rows.append(row)
    return rows


def _run_row(
    job: Mapping[str, Any], scheduled_for: datetime, attempt: int, state: str, now: datetime
) -> dict:
    return run_row(
        job_id=job["job_id"],
        shard=job["shard"],
        owner=job["owner"],
        origin="schedule",
        scheduled_for=scheduled_for,
        attempt=attempt,
        state=state,
        target=job["target"],
        retry=retry_of(job).to_json(),
        now=now,
    )
