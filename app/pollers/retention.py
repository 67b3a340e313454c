"""Retention: run history older than PUNCTUAL_HISTORY_DAYS is deleted, a little at a time.

A run counts as history once it finished (succeeded, failed, dead, skipped or
replayed: finished_at is set). Dead letters follow the same rule: a dead run is
listed and can be replayed for PUNCTUAL_HISTORY_DAYS after it died. Runs still in
flight (claimed, running) are never touched, whatever their age.

The shard's sweep (app.tasks.shard) prunes after the janitor: batches of
PRUNE_BATCH rows found by ix_runs_finished (shard, finished_at), each its own
short transaction with FOR UPDATE SKIP LOCKED, within PRUNE_BUDGET_S per sweep.
A claim never waits on it: claims lock job rows and insert new runs, and the
prune locks only finished runs, skipping any that someone else holds. A backlog
(history switched on over a big table) drains over successive sweeps.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import sqlalchemy as sa

from app.registry.schema import runs

PRUNE_BATCH = 1000
# A sweep runs in the worker's pool, beside the dispatches: a budget of 2 s per shard
# and sweep kept a 2-process worker pruning most of the time while a backlog lasted,
# and the steady load's lateness grew several-fold. 0.2 s still deletes a few batches
# per shard a sweep, more than a steady load finishes, and a backlog drains over many
# sweeps.
PRUNE_BUDGET_S = 0.2
FINISHED_STATES = ("succeeded", "failed", "dead", "skipped", "replayed")


def history_cutoff(now: datetime, history_days: float) -> datetime:
    """Runs that finished before this instant are deleted."""
    return now - timedelta(days=history_days)


def expired_runs(shard: int, cutoff: datetime, limit: int, lock: bool = True) -> sa.Select:
    stmt = (
        sa.select(runs.c.run_id)
        .where(
            runs.c.shard == shard,
            runs.c.finished_at.isnot(None),
            runs.c.finished_at < cutoff,
            runs.c.state.in_(FINISHED_STATES),
        )
        .order_by(runs.c.finished_at)
        .limit(limit)
    )
    return stmt.with_for_update(skip_locked=True) if lock else stmt


def prune(
    engine: sa.Engine,
    shard: int,
    now: datetime,
    history_days: float,
    batch: int = PRUNE_BATCH,
    budget_s: float = PRUNE_BUDGET_S,
) -> int:
    """Delete the shard's history older than `history_days`; returns how many runs went."""
    lock = engine.dialect.name != "sqlite"
    cutoff = history_cutoff(now, history_days)
    deadline = time.monotonic() + budget_s
    total = 0
    while True:
        with engine.begin() as conn:
            chosen = expired_runs(shard, cutoff, batch, lock).scalar_subquery()
            deleted = conn.execute(sa.delete(runs).where(runs.c.run_id.in_(chosen))).rowcount
        total += deleted
        if deleted < batch or time.monotonic() >= deadline:
            return total
