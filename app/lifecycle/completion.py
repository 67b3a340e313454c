"""Completion: finished attempts written back, batched, fenced by the lease token.

`complete` takes a batch of finished attempts (as a worker's completion buffer
flushes them) and writes them in ONE transaction per physical DSN:

1. lock the batch's job rows (SELECT ... FOR UPDATE, in key order so two batches
   never deadlock): settling a schedule run needs its job row;
2. settle each attempt whose job (schedule runs) still holds its lease_token
   (app.lifecycle.settlement, pure), each on its own (`_settle_one`, `recordable`):
   one target's answer never fails the batch of every owner;
3. write the runs with one UPDATE fenced in itself (`WHERE run_id = ? AND
   lease_token = ? AND state = 'running' RETURNING run_id`): an attempt whose job or
   run no longer holds its token, or whose run is no longer `running`, is stale: it
   changes nothing and is counted in STALE_COMPLETIONS (invariant 1);
4. write what the runs returned settle: jobs (`WHERE job_id = ? AND lease_token =
   ?`), one statement per shape, and new run rows for off-schedule retries and for the
   occurrences an `overlap: skip` job skipped while the run was in flight
   (app.registry.bulk).

Under a burst a batch holds tens of runs, and each statement's fixed cost (SQLAlchemy,
the driver, a round trip) is what counts: the run rows are not locked by a SELECT
of their own, their UPDATE is the fence (three statements a batch, not four).

The janitor settles expired leases through `apply` too, with the run states it
may take back (`claimed` as well as `running`) and retry_now.
"""

from __future__ import annotations

import logging
import random
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from app import metrics
from app.core.overlap import IN_FLIGHT
from app.core.retries import CallOutcome
from app.lifecycle.message import DispatchRun
from app.lifecycle.settlement import JOB_COLUMNS, Attempt, Settlement, settle
from app.registry.bulk import key_in
from app.registry.dialect import locks_rows
from app.registry.engines import Registry, refuse_moved_shards
from app.registry.records import run_row
from app.registry.schema import jobs
from app.registry.statements import FINISH_RUNS, INSERT_RUNS, SETTLE_JOBS, BulkUpdate
from app.registry.transient import first_line


@dataclass(frozen=True)
class Finished:
    run: DispatchRun
    outcome: CallOutcome
    finished_at: datetime
    # When its call went out. A run behind a full concurrency cap is started, then
    # waits for its slot: its started_at and lateness_ms become this instant, so the
    # history says when the target was called. None: no call was made (an expired lease).
    called_at: datetime | None = None


@dataclass(frozen=True)
class CompletionReport:
    applied: int = 0
    stale: int = 0

    def __add__(self, other: CompletionReport) -> CompletionReport:
        return CompletionReport(self.applied + other.applied, self.stale + other.stale)


log = logging.getLogger("punctual.completion")

# A run's `error` is at most this long: enough for any reason Punctual writes, and a
# target's text (an exception naming what it sent) cannot grow the row.
ERROR_MAX_CHARS = 1000
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: Postgres' text refuses them

_RUN_COLUMNS = ("state", "finished_at", "status_code", "error")
_CALLED_COLUMNS = (*_RUN_COLUMNS, "started_at", "lateness_ms")


def complete(
    registry: Registry, finished: Sequence[Finished], now: datetime, rand: Callable[[], float] = random.random
) -> CompletionReport:
    """Write a batch of finished attempts: one transaction per database (by the shard
    map; a batch refused by a move's fence is written where its shard went, and so is
    one sent to a database the shard left, whose rows are gone: refuse_moved_shards)."""

    def write(engine: sa.Engine, batch: list[Finished]) -> CompletionReport:
        with engine.begin() as conn:
            shards = {item.run.shard for item in batch}
            return apply(conn, batch, now, rand, registry.settings.lease_s, refuse_moved=shards)

    return sum(registry.for_each_database(finished, lambda item: item.run.shard, write), CompletionReport())


def apply(
    conn: sa.Connection,
    batch: Sequence[Finished],
    now: datetime,
    rand: Callable[[], float],
    lease_s: float,
    runs_write: BulkUpdate = FINISH_RUNS,
    retry_now: bool = False,
    refuse_moved: Iterable[int] = (),
) -> CompletionReport:
    """Fence, settle and write `batch` inside the caller's transaction, refused first if
    a move took a shard of `refuse_moved` away (refuse_moved_shards; read with the job
    rows it locks, when it locks some: one round trip less per flush).

    The runs, fenced by their token and state (`runs_write`: the completion's
    FINISH_RUNS, of runs `running`; the janitor's EXPIRE_RUNS, `claimed` or `running`),
    returning the ones written; a worker's completion also sets started_at and
    lateness_ms to when the call went out (the janitor's, of a call it cannot know,
    leaves them). Then the jobs of schedule runs, fenced by the token, one SETTLE_JOBS
    per shape (a settlement sets only the columns it changes), and the next attempts of
    runs leased on their rows and the occurrences skipped while a run was in flight
    (INSERT_RUNS; app.registry.statements names each).
    """
    locking = {f.run.job_id for f in batch if not f.run.leased_on_run}
    if locking:
        recurring = any(f.run.recurring for f in batch if not f.run.leased_on_run)
        job_rows = _lock_jobs(conn, locking, refuse_moved, whole=recurring)
    else:
        refuse_moved_shards(conn, refuse_moved)
        job_rows = {}
    run_writes: list[dict[str, Any]] = []
    settlements = []
    for item in batch:
        run = item.run
        job = job_rows.get(run.job_id)
        if not run.leased_on_run and (job is None or job["lease_token"] != run.lease_token):
            continue  # stale: its job's lease is gone
        attempt = Attempt(run.job_id, run.origin, run.scheduled_for, run.attempt, run.retry, run.own_lease)
        settled, status_code = _settle_one(attempt, item.outcome, job, now, rand, retry_now)
        write = {
            "run_id": run.run_id,
            "lease_token": run.lease_token,
            "state": settled.run_state,
            "finished_at": item.finished_at,
            "status_code": status_code,
            "error": recordable(settled.error),
        }
        if item.called_at is not None:
            write["started_at"] = item.called_at
            write["lateness_ms"] = int((item.called_at - run.scheduled_for).total_seconds() * 1000)
        run_writes.append(write)
        settlements.append((run, settled))
    # Key order, as the jobs were locked: two batches meet their rows in one order.
    run_writes.sort(key=lambda row: row["run_id"])
    written: set = set()
    for called in (True, False):  # the worker's completions are all called; the janitor's none
        rows = [row for row in run_writes if ("started_at" in row) is called]
        if rows:
            written.update(
                runs_write.update(
                    conn,
                    rows,
                    {"leased_until": None, "updated_at": now},
                    _CALLED_COLUMNS if called else _RUN_COLUMNS,
                )
            )
    job_writes, new_rows = [], []
    states: Counter[str] = Counter()
    for run, settled in settlements:
        if run.run_id not in written:  # stale: the run's token or state changed
            continue
        if settled.job is not None:
            job_writes.append({**settled.job, "job_id": run.job_id, "_token": run.lease_token})
        if settled.retry_at is not None:
            new_rows.append(_retry_row(run, settled.retry_at, now, lease_s))
        new_rows.extend(_skipped_row(run, occurrence.nominal, now) for occurrence in settled.skipped)
        states[settled.run_state] += 1
        if settled.skipped or settled.unrecorded_skips:
            states["skipped"] += len(settled.skipped) + settled.unrecorded_skips
    for shape, rows in _by_shape(job_writes):
        # The lease fence, written into the statement: WHERE job_id = ? AND lease_token = ?
        fenced = [{**row, "lease_token": row["_token"]} for row in rows]
        constants = {"updated_at": now, **({"lease_token": None} if "lease_token" in shape else {})}
        SETTLE_JOBS.update(conn, fenced, constants, [c for c in shape if c != "lease_token"])
    INSERT_RUNS.insert(conn, new_rows)
    for state, count in states.items():
        metrics.RUNS.labels(state).inc(count)
    if states["dead"]:
        metrics.DEAD_LETTERS.inc(states["dead"])
    stale = len(batch) - len(written)
    if stale:
        metrics.STALE_COMPLETIONS.inc(stale)
    return CompletionReport(applied=len(written), stale=stale)


def _settle_one(
    attempt: Attempt,
    outcome: CallOutcome,
    job: Any,
    now: datetime,
    rand: Callable[[], float],
    retry_now: bool,
) -> tuple[Settlement, int | None]:
    """The settlement of one attempt and the status to record. An outcome that cannot
    be settled (its status is not an HTTP status, or settling it raised: a bug, or an
    answer nobody foresaw) is settled as a failed call saying why, a retry following
    as after any failure: the others of the batch are written all the same."""
    status = outcome.status_code
    try:
        if status is not None and (
            isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 999
        ):
            raise ValueError(f"status {str(status)[:20]!r} is not an HTTP status")
        return settle(attempt, outcome, job, now, rand, retry_now=retry_now), status
    except Exception as exc:
        reason = f"the answer could not be settled ({type(exc).__name__}: {first_line(exc)})"
        log.warning("run of job %s attempt %d: %s", attempt.job_id, attempt.attempt, reason)
        failure = CallOutcome(error=reason)
        return settle(attempt, failure, job, now, rand, retry_now=retry_now), None


def recordable(text: str | None) -> str | None:
    """`text` as a run's `error` can hold it: at most ERROR_MAX_CHARS, without the
    characters PostgreSQL's text refuses (each becomes U+FFFD)."""
    if text is None:
        return None
    if len(text) > ERROR_MAX_CHARS:
        text = text[: ERROR_MAX_CHARS - 1] + "\u2026"
    return _UNSTORABLE.sub("\ufffd", text)


# What settling needs from a job row: not its target or payload (JSON to decode), nor
# the instants it never reads (each one decoded is a datetime made per row).
_SETTLE_COLUMNS = [jobs.c[name] for name in ("lease_token", *JOB_COLUMNS)]
# What it needs from a one-off's: a recurring job's row also feeds its next occurrence
# (app.core.schedules.advance), and a burst's one-offs spent more on turning the nine
# instants of each row into datetimes than on the rest of the lock.
_ONE_OFF_COLUMNS = [jobs.c.job_id, jobs.c.state, jobs.c.schedule_kind, jobs.c.lease_token]


def _lock_jobs(conn: sa.Connection, job_ids: set, refuse_moved: Iterable[int], whole: bool) -> dict:
    """The batch's job rows, locked in key order. On PostgreSQL, behind the move fence of
    the shards `refuse_moved` names: its refusal is a one-time filter, evaluated before
    the scan even when no row is there any more (the shard's rows left with a move):

    SELECT ... FROM jobs WHERE jobs.job_id = ANY (:job_id_keys)
    AND (SELECT true FROM punctual_refuse_fenced(CAST(:shards AS smallint[])) AS fence)
    ORDER BY jobs.job_id FOR UPDATE

    Only a one-off's columns unless `whole` (a run of the batch is an occurrence of a
    recurring job); a job found recurring all the same (its schedule was changed while
    its run was in flight) is read whole too, under the lock already held.
    """
    stmt = (
        sa.select(*(_SETTLE_COLUMNS if whole else _ONE_OFF_COLUMNS))
        .where(key_in(conn, jobs.c.job_id, sorted(job_ids)))
        .order_by(jobs.c.job_id)
    )
    shards = sorted(set(refuse_moved))
    if locks_rows(conn):
        stmt = stmt.with_for_update()
        if shards:
            stmt = stmt.where(_fence(shards))
    rows = {row["job_id"]: row for row in conn.execute(stmt).mappings()}
    if not whole and (recurring := sorted(k for k, row in rows.items() if row["schedule_kind"] != "once")):
        read = sa.select(*_SETTLE_COLUMNS).where(key_in(conn, jobs.c.job_id, recurring))
        rows.update((row["job_id"], row) for row in conn.execute(read).mappings())
    return rows


def _fence(shards: list[int]) -> sa.ScalarSelect:
    array = postgresql.ARRAY(sa.SmallInteger)
    refusal = sa.func.punctual_refuse_fenced(
        sa.cast(sa.bindparam("fenced_shards", shards, type_=array), array)
    )
    return sa.select(sa.true()).select_from(refusal.alias("fence")).scalar_subquery()


def _by_shape(rows: Iterable[dict]) -> list[tuple[tuple[str, ...], list[dict]]]:
    """Group job writes by which columns they set: executemany needs one shape."""
    groups: dict[tuple[str, ...], list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(sorted(k for k in row if not k.startswith("_") and k != "job_id"))].append(row)
    return list(groups.items())


def _skipped_row(run: DispatchRun, nominal: datetime, now: datetime) -> dict:
    """An occurrence that fell due while `run` was in flight, of a job whose overlap is
    `skip`: recorded, not run."""
    return run_row(
        job_id=run.job_id,
        shard=run.shard,
        owner=run.owner,
        origin="schedule",
        scheduled_for=nominal,
        attempt=1,
        state="skipped",
        target=run.target,
        retry=dict(run.retry),
        now=now,
        finished_at=now,
        error=IN_FLIGHT,
    )


def _retry_row(run: DispatchRun, retry_at: datetime, now: datetime, lease_s: float) -> dict:
    """An off-schedule run's next attempt: its own lease, published by the relay sweep when due."""
    return run_row(
        job_id=run.job_id,
        shard=run.shard,
        owner=run.owner,
        origin=run.origin,
        scheduled_for=run.scheduled_for,
        attempt=run.attempt + 1,
        state="claimed",
        target=run.target,
        retry=dict(run.retry),
        now=now,
        lease_token=uuid.uuid4(),
        leased_until=retry_at + timedelta(seconds=lease_s),
        due_at=retry_at,
        published=False,
    )
