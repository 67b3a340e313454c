"""What each logical shard holds, read from the database serving it (`punctual shards`).

A database may also hold rows of a shard it does not serve (a move's copy, or the
rows a finished move is still deleting); only the serving database is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from app.core.timefmt import format_instant
from app.registry.engines import Registry
from app.registry.schema import claimed_without_row, jobs, runs


@dataclass(frozen=True)
class ShardRow:
    shard: int
    database: int  # index into PUNCTUAL_DATABASE_URLS
    jobs: int
    due_now: int
    oldest_due: datetime | None
    in_flight: int
    move: str | None  # "copying to 2", "fenced", ...

    def as_dict(self) -> dict:
        return {
            "shard": self.shard,
            "database": self.database,
            "jobs": self.jobs,
            "due_now": self.due_now,
            "oldest_due": format_instant(self.oldest_due) if self.oldest_due else None,
            "in_flight": self.in_flight,
            "move": self.move,
        }

    def as_text(self) -> tuple[str, ...]:
        return (
            str(self.shard),
            str(self.database),
            f"{self.jobs:,}",
            f"{self.due_now:,}",
            format_instant(self.oldest_due) if self.oldest_due else "-",
            f"{self.in_flight:,}",
            self.move or "-",
        )


def shard_census(registry: Registry, now: datetime) -> list[ShardRow]:
    routing = registry.reload_map()
    due = sa.and_(jobs.c.state == "scheduled", jobs.c.next_run_at <= now)
    job_counts = sa.select(
        jobs.c.shard,
        sa.func.count(),
        sa.func.count().filter(due),
        sa.func.min(jobs.c.next_run_at).filter(due),
    ).group_by(jobs.c.shard)
    in_flight = (
        sa.select(runs.c.shard, sa.func.count())
        .where(runs.c.state.in_(("claimed", "running")))
        .group_by(runs.c.shard)
    )
    unstarted = sa.select(jobs.c.shard, sa.func.count()).where(claimed_without_row()).group_by(jobs.c.shard)
    found: dict[int, tuple] = {}
    flying: dict[int, int] = {}
    for index in range(len(registry.engines)):
        served = set(routing.shards_of(index))
        if not served:
            continue
        # A replica read (docs/api.md "Replica reads").
        counted, flown, unflown = registry.read(
            index,
            lambda conn: (
                conn.execute(job_counts).all(),
                conn.execute(in_flight).all(),
                conn.execute(unstarted).all(),
            ),
        )
        for shard, total, due_now, oldest in counted:
            if shard in served:
                found[shard] = (total, due_now, oldest)
        for shard, count in flown:
            if shard in served:
                flying[shard] = count
        for shard, count in unflown:
            if shard in served:
                flying[shard] = flying.get(shard, 0) + count
    rows = []
    for shard, placement in enumerate(routing.map.placements):
        total, due_now, oldest = found.get(shard, (0, 0, None))
        move = None
        if placement.move_step is not None:
            peer = routing.index_of_database(placement.move_peer) if placement.move_peer else None
            move = (
                f"{placement.move_step}, from {peer}"
                if placement.move_step == "switched"
                else f"{placement.move_step}, to {peer}"
            )
        rows.append(
            ShardRow(shard, routing.shard_index[shard], total, due_now, oldest, flying.get(shard, 0), move)
        )
    return rows
