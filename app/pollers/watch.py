"""When each shard next has work: what beat asks before it sends a poll or a sweep.

`next_work` reads, for every shard of one database, in one statement of index
probes (each a MIN over a partial index that starts with the shard):

- the earliest next_run_at of a scheduled job (ix_jobs_due): a poll claims it;
- the earliest due_at of an unpublished run (ix_runs_outbox): a poll's relay sweep
  publishes it;
- the earliest leased_until of a lease (ix_jobs_leased, ix_runs_leased): a sweep's
  janitor takes it back once it passed;
- the earliest finished_at of a finished run (ix_runs_finished): a sweep's
  retention deletes it once it is older than PUNCTUAL_HISTORY_DAYS.

A shard with none of these has nothing to do until a write gives it some; beat
asks again every PUNCTUAL_POLL_INTERVAL_S, so such a write is seen as soon as a
poll sent every interval would have claimed it (app.beat.gate decides).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from app.registry.schema import UTCDateTime


@dataclass(frozen=True)
class ShardWork:
    """The earliest instant of each kind of work of one shard (None: none)."""

    job_due: datetime | None = None
    outbox_due: datetime | None = None
    lease_ends: datetime | None = None
    finished: datetime | None = None


# Each probe is written with constants only, so that it states its partial index's
# predicate word for word and the planner uses the index under any plan.
_PROBES = (
    ("due", "next_run_at", "jobs", "state = 'scheduled' AND next_run_at > '0001-01-01 00:00:00+00'"),
    ("outbox", "due_at", "runs", "published = false"),
    ("jlease", "leased_until", "jobs", "lease_token IS NOT NULL"),
    ("rlease", "leased_until", "runs", "state IN ('claimed', 'running')"),
    ("finished", "finished_at", "runs", "finished_at IS NOT NULL"),
)


@functools.cache
def next_work_statement(shards: tuple[int, ...]) -> sa.TextualSelect:
    """A row per shard: its five instants. One correlated probe per kind, run for each
    shard of a VALUES list: a plan of five subplans, whatever the shard count, and
    the same text at every execution (the shards are constants)."""
    values = ", ".join(f"({int(shard)})" for shard in shards)
    columns = ", ".join(
        f"(SELECT min({column}) FROM {table} WHERE {table}.shard = s.shard AND {where}) AS {name}"
        for name, column, table, where in _PROBES
    )
    types = {name: UTCDateTime() for name, *_ in _PROBES}
    return sa.text(f"WITH s(shard) AS (VALUES {values}) SELECT s.shard, {columns} FROM s").columns(
        sa.column("shard", sa.Integer), *(sa.column(name, t) for name, t in types.items())
    )


def next_work(conn: sa.Connection, shards: Sequence[int]) -> dict[int, ShardWork]:
    """The earliest work of each of `shards` (all on the database of `conn`)."""
    if not shards:
        return {}
    found = {}
    for row in conn.execute(next_work_statement(tuple(shards))).mappings():
        leases = [at for at in (row["jlease"], row["rlease"]) if at is not None]
        found[int(row["shard"])] = ShardWork(
            job_due=row["due"],
            outbox_due=row["outbox"],
            lease_ends=min(leases) if leases else None,
            finished=row["finished"],
        )
    return found
