"""The relay: runs in the outbox (runs.published = false) become dispatch messages.

A claim publishes its runs itself, as a few dispatch messages (batches of runs,
app.lifecycle.message), before its COMMIT (app.pollers.claim `send_all`): its runs
never wait in the outbox. `publish_claimed` publishes the runs of a claim made
without `send` and marks those with a row published. `sweep` finds every
unpublished `claimed` run whose due_at has passed (triggered and replayed runs at
once, off-schedule retries when their retry time comes, runs a paused owner's
resume gives back) and publishes it (invariant 8). Publishing
twice is harmless: starting a run is fenced (invariant 4), which is also why a
publish or a mark that meets a transient broker or database failure is simply sent
again (app.registry.transient).

`send(shard, messages)` is injected: in a worker it publishes the batch's dispatch
messages and waits for the broker's confirms of them all (app.tasks.dispatch
send_dispatches); tests pass a recorder. Each message is (eta, entries): eta is None,
or the instant the runs of a message claimed ahead may start (app.lifecycle.message).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime

import sqlalchemy as sa

from app import metrics, tracing
from app.core import jitter
from app.core.timefmt import utcnow
from app.lifecycle.message import DispatchRun, to_messages
from app.registry.bulk import key_in, state_among
from app.registry.dialect import locks_rows
from app.registry.engines import statement_connection
from app.registry.schema import jobs, runs
from app.registry.transient import retrying

# send(shard, [(eta, entries), ...]): one batch's messages, all published when it returns.
Send = Callable[[int, list[tuple[datetime | None, list[dict]]]], None]

SWEEP_BATCH = 500


def publish_claimed(engine: sa.Engine, shard: int, claimed: Sequence[DispatchRun], send: Send) -> int:
    """Publish a claim's runs, then mark them published. Returns messages sent."""
    if not claimed:
        return 0
    sent = send_all(shard, claimed, send)

    def mark() -> None:
        # One statement, in autocommit on PostgreSQL: no BEGIN and COMMIT round trips.
        with statement_connection(engine) as conn:
            conn.execute(_mark_published(conn, [run.run_id for run in claimed]))

    # Given up, the runs stay unpublished and the sweep sends them again after the
    # relay grace: a duplicate message, whose start is fenced.
    retrying(mark, f"marking {len(claimed)} runs published")
    return sent


@functools.cache
def outbox_due(lock: bool = True, holding: bool = False) -> sa.Select:
    """Unpublished claimed runs of a shard whose due_at has passed (ix_runs_outbox),
    with their job's payload (runs do not copy it) and, for a schedule run, its fire
    instant: the job's next_run_at while the job holds that run's lease (a run with a
    lease of its own, an `allow` job's, has it from its occurrence and the job's
    jitter_s, `_fire_at`). `holding`:
    none of the owners bound as `held` (paused owners: their runs wait).

    Built once (every poll tick sweeps); `shard`, `now`, `limit` (and `held`) are bound
    at each execution."""
    fire_at = sa.case(
        (sa.and_(runs.c.origin == "schedule", jobs.c.lease_token == runs.c.lease_token), jobs.c.next_run_at),
        else_=sa.null(),
    ).label("fire_at")
    stmt = (
        sa.select(runs, jobs.c.payload, jobs.c.jitter_s, fire_at)
        .join(jobs, jobs.c.job_id == runs.c.job_id)
        .where(
            runs.c.shard == sa.bindparam("shard"),
            runs.c.published == sa.false(),
            runs.c.due_at <= sa.bindparam("now"),
            state_among(runs.c.state, ("claimed",)),
            *_not_held(holding),
        )
        .order_by(runs.c.due_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    return stmt.with_for_update(of=runs, skip_locked=True) if lock else stmt


@functools.cache
def _outbox_has_due(holding: bool = False) -> sa.Select:
    """Whether the outbox of a shard holds a run that is due (`shard`, `now` bound; and
    `held` with `holding`)."""
    return (
        sa.select(runs.c.run_id)
        .where(
            runs.c.shard == sa.bindparam("shard"),
            runs.c.published == sa.false(),
            runs.c.due_at <= sa.bindparam("now"),
            state_among(runs.c.state, ("claimed",)),
            *_not_held(holding),
        )
        .limit(1)
    )


def _not_held(holding: bool) -> tuple[sa.ColumnElement, ...]:
    return (runs.c.owner.not_in(sa.bindparam("held", expanding=True)),) if holding else ()


def sweep(
    engine: sa.Engine,
    shard: int,
    now: datetime,
    send: Send,
    limit: int = SWEEP_BATCH,
    held: Collection[str] = (),
) -> int:
    """Publish what the outbox holds that is due, but the runs of the `held` owners
    (paused: app.services.owners); returns how many runs were published.

    The rows stay locked while they are published so that two sweeps on one shard
    do not both send them; the UPDATE commits only after the broker confirmed.
    """
    holding = bool(held)
    bound: dict = {"shard": shard, "now": now, **({"held": sorted(held)} if holding else {})}
    # Every poll tick sweeps, and the outbox is nearly always empty: one look in
    # autocommit first (ix_runs_outbox), not a transaction of three round trips.
    with statement_connection(engine) as conn:
        if conn.execute(_outbox_has_due(holding), bound).first() is None:
            return 0
    lock = locks_rows(engine)
    spans = tracing.spans()
    total = 0
    while True:
        began_ns = time.time_ns() if spans is not None else 0
        with engine.begin() as conn:
            rows = conn.execute(outbox_due(lock, holding), {**bound, "limit": limit}).mappings().all()
            if not rows:
                return total
            found = [DispatchRun.from_row(row, row["payload"], _fire_at(row)) for row in rows]
            send_all(shard, found, send)
            conn.execute(_mark_published(conn, [run.run_id for run in found]))
        if spans is not None:  # a schedule run's claim has its span already (its claim's)
            spans.claimed(
                [run for run in found if run.leased_on_run], began_ns, time.time_ns(), "relay sweep"
            )
        total += len(found)
        if len(rows) < limit:
            return total


def _fire_at(row) -> datetime | None:
    """When a swept schedule run may start: the job's next_run_at while the job holds its
    lease, or, for a run holding its own (an `allow` job's), its occurrence's instant."""
    if row["fire_at"] is not None or row["origin"] != "schedule" or row["leased_until"] is None:
        return row["fire_at"]
    return jitter.fire_at(row["job_id"], row["scheduled_for"], row["jitter_s"])


def send_all(shard: int, found: Sequence[DispatchRun], send: Send, retry: bool = True) -> int:
    """Publish `found` as dispatch messages with `send`, retried whole (once only
    without `retry`: a claim publishing inside its transaction is retried whole by its
    poll instead of holding its rows); returns how many messages."""
    messages = to_messages(found, utcnow())
    # A broker that drops the connection is reconnected to by the next try; the batch
    # is sent again whole, and a message sent twice is a duplicate whose start is fenced.
    if retry:
        retrying(
            functools.partial(send, shard, messages),
            f"publishing {len(found)} runs of shard {shard} in {len(messages)} messages",
        )
    else:
        send(shard, messages)
    metrics.PUBLISHED.labels(str(shard)).inc(len(messages))
    return len(messages)


def _mark_published(conn: sa.Connection, run_ids: list) -> sa.Update:
    return sa.update(runs).where(key_in(conn, runs.c.run_id, run_ids)).values(published=True)
