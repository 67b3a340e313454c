"""`punctual shards move`: a logical shard moves whole onto another database, online.

The steps (docs/design.md, "Moving a shard"), each recorded in the shard's map row
(shard_map.move_step) before it starts, so a move killed at any point is finished by
running it again or undone by `--abort`:

1. copying: the target refuses writes to the shard (a fence, migration 0004); the
   source keeps serving and records the keys of the shard's rows that change
   (`tracking`). Jobs and runs are copied in batches, keyset by primary key, then
   the recorded changes until few are left.
2. fenced: pollers stop claiming the shard and the source refuses its writes; the
   mover waits for every transaction that began before the fence, copies the last
   changes and compares the counts. A worker's write refused meanwhile waits for the
   switch and is written on the new database (Registry.for_each_database): nothing
   lost, nothing written twice. The fence lasts the final delta, not the whole copy.
3. switched: the map names the target and its fence is lifted; the source's rows
   are deleted in batches, and the source refuses the shard's writes for good: a
   worker's write asks for the fence first (refuse_moved_shards), since once the
   rows are gone an UPDATE there would change nothing and fire no trigger.

A change made while the shard is tracked locks its key in shard_changes until it
commits (migration 0006), and the mover takes keys FOR UPDATE SKIP LOCKED, so it
never copies a row an uncommitted change is about to replace. The copies are
idempotent (a batch replaces its rows), so a failed command resumes at its step.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from psycopg import sql as psycopg_sql

from app.registry.engines import Registry
from app.registry.schema import jobs, runs, shard_changes, shard_fences
from app.registry.shard_map import Placement, Routing, set_placement, short

BATCH = 5000
CHANGES_BATCH = 1000
# Catching up before the fence: stop when a round leaves fewer changes than this.
CATCH_UP_ENOUGH = 200
CATCH_UP_ROUNDS = 20
# How long the fence waits for transactions that began before it.
OLDER_WRITERS_TIMEOUT_S = 60.0
# Writes by the mover itself pass the fences (the triggers read this setting).
BYPASS = "SET LOCAL punctual.mover = 'on'"

TABLES = ((jobs, jobs.c.job_id), (runs, runs.c.run_id))


class MoveError(Exception):
    """A move cannot go on; one line saying what to do."""


@dataclass(frozen=True)
class MoveReport:
    shard: int
    source: int
    target: int
    jobs: int
    runs: int
    fence_s: float
    duration_s: float


def _now() -> datetime:
    return datetime.now(UTC)


def move_shard(
    registry: Registry,
    shard: int,
    to_index: int,
    echo: Callable[[str], None] = lambda _l: None,
    batch: int = BATCH,
) -> MoveReport:
    """Move `shard` to PUNCTUAL_DATABASE_URLS[to_index], or finish the move in progress."""
    with _only_mover(registry, shard):
        return _move(registry, shard, to_index, echo, batch)


def abort_move(registry: Registry, shard: int, echo: Callable[[str], None] = lambda _l: None) -> None:
    """Undo a move that has not switched yet: the shard stays where it was."""
    with _only_mover(registry, shard):
        _abort(registry, shard, echo)


@contextlib.contextmanager
def _only_mover(registry: Registry, shard: int):
    """One command at a time moves (or aborts) a shard: a session lock on the home,
    released by the database if the command dies."""
    with registry.home.connect() as conn:
        taken = conn.execute(
            sa.text("SELECT pg_try_advisory_lock(7710227, :shard)"), {"shard": shard}
        ).scalar()
        if not taken:
            raise MoveError(f"another `punctual shards move` of shard {shard} is running now")
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(7710227, :shard)"), {"shard": shard})
            conn.commit()


def _move(
    registry: Registry, shard: int, to_index: int, echo: Callable[[str], None], batch: int
) -> MoveReport:
    started = time.monotonic()
    routing = registry.reload_map()
    if not 0 <= shard < routing.map.shards:
        raise MoveError(f"shard {shard}: there are shards 0 to {routing.map.shards - 1}")
    if not 0 <= to_index < len(routing.identities):
        last = len(routing.identities) - 1
        raise MoveError(f"--to {to_index}: PUNCTUAL_DATABASE_URLS has indexes 0 to {last}")
    target_id = routing.identities[to_index].database_id
    placement = routing.map.placements[shard]
    step = placement.move_step
    if step is None:
        if placement.database_id == target_id:
            raise MoveError(f"shard {shard} is already on PUNCTUAL_DATABASE_URLS[{to_index}]")
        source_id = placement.database_id
        _set_step(registry, shard, Placement(source_id, target_id, "copying"))
        step = "copying"
    else:
        source_id, recorded = _move_ends(placement)
        if recorded != target_id:
            raise MoveError(
                f"a move of shard {shard} to PUNCTUAL_DATABASE_URLS[{routing.index_of_database(recorded)}] "
                f"is in progress: run it again with that --to, or `punctual shards move --abort {shard}`"
            )
    source_index = routing.index_of(source_id)
    source, target = registry.engines[source_index], registry.engines[to_index]
    echo(
        f"shard {shard}: PUNCTUAL_DATABASE_URLS[{source_index}] ({short(source_id)}) -> "
        f"[{to_index}] ({short(target_id)}), {'resuming at ' + step if step != 'copying' else 'copying'}"
    )
    fence_s = 0.0
    counts = (0, 0)
    if step == "copying":
        _set_fence(target, shard, "fenced")
        _set_fence(source, shard, "tracking", replace=False)
        _wait_for_older_writers(source)
        copy_started = time.monotonic()
        copied = _copy_shard(source, target, shard, batch)
        echo(f"copied {copied[0]:,} jobs and {copied[1]:,} runs in {time.monotonic() - copy_started:.1f} s")
        for _ in range(CATCH_UP_ROUNDS):
            if _apply_changes(source, target, shard) < CATCH_UP_ENOUGH:
                break
        _set_step(registry, shard, Placement(source_id, target_id, "fenced"))
        step = "fenced"
    if step == "fenced":
        fenced_at = time.monotonic()
        _set_fence(source, shard, "fenced")
        _wait_for_older_writers(source)
        while _apply_changes(source, target, shard):
            pass
        counts = _verified_counts(source, target, shard, batch, echo)
        _drop_fence(target, shard)
        _set_step(registry, shard, Placement(target_id, source_id, "switched"))
        fence_s = time.monotonic() - fenced_at
        echo(
            f"switched after a fence of {fence_s:.2f} s: {counts[0]:,} jobs, {counts[1]:,} runs on both sides"
        )
        step = "switched"
    delete_started = time.monotonic()
    deleted = _delete_shard(source, shard, batch)
    with source.begin() as conn:
        conn.execute(shard_changes.delete().where(shard_changes.c.shard == shard))
    _set_step(registry, shard, Placement(target_id))
    echo(
        f"deleted {deleted:,} rows of shard {shard} from PUNCTUAL_DATABASE_URLS[{source_index}] "
        f"in {time.monotonic() - delete_started:.1f} s; done"
    )
    return MoveReport(
        shard, source_index, to_index, counts[0], counts[1], fence_s, time.monotonic() - started
    )


def _abort(registry: Registry, shard: int, echo: Callable[[str], None]) -> None:
    routing = registry.reload_map()
    placement = routing.map.placements[shard]
    if placement.move_step is None:
        raise MoveError(f"no move of shard {shard} is in progress")
    if placement.move_step == "switched":
        raise MoveError(
            f"the move of shard {shard} is past its switch (the new database serves it): run "
            f"`punctual shards move {shard} --to {routing.shard_index[shard]}` to finish it"
        )
    source_id, target_id = _move_ends(placement)
    source = registry.engines[routing.index_of(source_id)]
    target = registry.engines[routing.index_of(target_id)]
    # Claims resume first; the copy on the target goes while the map still names it,
    # so reads that leave out a move's copy never see it as the shard's rows.
    _set_step(registry, shard, Placement(source_id, target_id, "copying"))
    _drop_fence(source, shard)
    deleted = _delete_shard(target, shard, BATCH)
    with source.begin() as conn:
        conn.execute(shard_changes.delete().where(shard_changes.c.shard == shard))
    _set_step(registry, shard, Placement(source_id))
    echo(
        f"move of shard {shard} aborted: it stays on PUNCTUAL_DATABASE_URLS[{routing.shard_index[shard]}]; "
        f"{deleted:,} copied rows removed"
    )


def _move_ends(placement: Placement) -> tuple[uuid.UUID, uuid.UUID]:
    """(source, target) of the move recorded in a placement."""
    if placement.move_peer is None:
        raise MoveError("the shard map names a move without its other database")
    if placement.move_step == "switched":
        return placement.move_peer, placement.database_id
    return placement.database_id, placement.move_peer


def _set_step(registry: Registry, shard: int, placement: Placement) -> Routing:
    with registry.home.begin() as conn:
        set_placement(conn, shard, placement, _now())
    return registry.reload_map()


def _set_fence(engine: sa.Engine, shard: int, mode: str, replace: bool = True) -> None:
    stmt = sa.dialects.postgresql.insert(shard_fences).values(shard=shard, mode=mode)
    stmt = (
        stmt.on_conflict_do_update(index_elements=["shard"], set_={"mode": mode})
        if replace
        else stmt.on_conflict_do_nothing(index_elements=["shard"])
    )
    with engine.begin() as conn:
        conn.execute(stmt)


def _drop_fence(engine: sa.Engine, shard: int) -> None:
    with engine.begin() as conn:
        conn.execute(shard_fences.delete().where(shard_fences.c.shard == shard))


def _wait_for_older_writers(engine: sa.Engine, timeout_s: float = OLDER_WRITERS_TIMEOUT_S) -> None:
    """Wait until every transaction of this database that had written when the fence
    was committed has ended (as CREATE INDEX CONCURRENTLY waits). A writer whose
    statement ends later runs the fence trigger after it, and the trigger's query
    sees the fence: it is refused (fenced) or its keys are recorded (tracking)."""
    writers = sa.text(
        "SELECT pid, backend_xid::text FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + timeout_s
    with engine.connect() as conn:
        older = set(conn.execute(writers).all())
        conn.commit()
        while older:
            older &= set(conn.execute(writers).all())
            conn.commit()
            if not older:
                return
            if time.monotonic() > deadline:
                raise MoveError(
                    f"a transaction older than the fence is still open after {timeout_s:g} s "
                    f"(pids {', '.join(str(pid) for pid, _xid in sorted(older))}); run the move again later"
                )
            time.sleep(0.02)


def _copy_shard(source: sa.Engine, target: sa.Engine, shard: int, batch: int) -> tuple[int, int]:
    """Every row of the shard, batch by batch (keyset by key); a batch replaces its rows.

    A batch is a key range (after the last one, up to the batch-th key) streamed with
    COPY ... TO STDOUT from the source into COPY ... FROM STDIN on the target, binary,
    so rows never become Python objects; the target's rows in that range are deleted
    first, in the same transaction."""
    counts = []
    for table, key in TABLES:
        copied = 0
        last = None
        while True:
            bounds = sa.select(key).where(table.c.shard == shard).order_by(key).offset(batch - 1).limit(1)
            if last is not None:
                bounds = bounds.where(key > last)
            with source.connect() as conn:
                upper = conn.execute(bounds).scalar()
            where = [psycopg_sql.SQL("shard = {}").format(psycopg_sql.Literal(shard))]
            if last is not None:
                where.append(
                    psycopg_sql.SQL("{} > {}").format(
                        psycopg_sql.Identifier(key.name), psycopg_sql.Literal(last)
                    )
                )
            if upper is not None:
                where.append(
                    psycopg_sql.SQL("{} <= {}").format(
                        psycopg_sql.Identifier(key.name), psycopg_sql.Literal(upper)
                    )
                )
            copied += _stream(source, target, table, psycopg_sql.SQL(" AND ").join(where))
            if upper is None:
                break
            last = upper
        counts.append(copied)
    return counts[0], counts[1]


def _stream(source: sa.Engine, target: sa.Engine, table: sa.Table, where: psycopg_sql.Composable) -> int:
    """COPY the rows of `table` matching `where` from source to target, replacing them there.
    (COPY takes no server-side parameters: the bounds are literals, quoted by psycopg.)"""
    name = psycopg_sql.Identifier(table.name)
    columns = psycopg_sql.SQL(", ").join(psycopg_sql.Identifier(c.name) for c in table.c)
    reader, writer = source.raw_connection(), target.raw_connection()
    out_conn, in_conn = reader.driver_connection, writer.driver_connection  # psycopg's own connections
    assert out_conn is not None and in_conn is not None
    try:
        with out_conn.cursor() as out_cursor, in_conn.cursor() as in_cursor:
            in_cursor.execute(BYPASS)
            in_cursor.execute(psycopg_sql.SQL("DELETE FROM {} WHERE {}").format(name, where))
            copy_out = psycopg_sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT (FORMAT BINARY)")
            copy_in = psycopg_sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)")
            with (
                out_cursor.copy(copy_out.format(columns, name, where)) as out_copy,
                in_cursor.copy(copy_in.format(name, columns)) as in_copy,
            ):
                for block in out_copy:
                    in_copy.write(block)
            written = in_cursor.rowcount
        writer.commit()
        reader.commit()
        return written
    finally:
        writer.close()
        reader.close()


def _apply_changes(source: sa.Engine, target: sa.Engine, shard: int) -> int:
    """Copy one batch of recorded changes; returns how many keys it took (0: none left).

    The keys are deleted on the source and the rows read in one transaction that
    commits after the target's: a crash in between leaves the keys to copy again,
    and a row changed after it was read is recorded anew (its change waits for this
    transaction's lock on the key, then records it again). A key whose change has
    not committed yet is locked by that change and skipped: read now, its row would
    be the one before the change.
    """
    with source.begin() as conn:
        taken = conn.execute(
            shard_changes.delete()
            .where(
                sa.tuple_(shard_changes.c.table_name, shard_changes.c.row_key).in_(
                    sa.select(shard_changes.c.table_name, shard_changes.c.row_key)
                    .where(shard_changes.c.shard == shard)
                    .limit(CHANGES_BATCH)
                    .with_for_update(skip_locked=True)
                )
            )
            .returning(shard_changes.c.table_name, shard_changes.c.row_key)
        ).all()
        if not taken:
            return 0
        writes = []
        for table, key in TABLES:
            keys = [row.row_key for row in taken if row.table_name == table.name]
            if keys:
                rows = [dict(r) for r in conn.execute(sa.select(table).where(key.in_(keys))).mappings()]
                writes.append((table, key, keys, rows))
        with target.begin() as target_conn:
            target_conn.exec_driver_sql(BYPASS)
            for table, key, keys, rows in writes:
                target_conn.execute(table.delete().where(key.in_(keys)))
                if rows:  # a batch of at most CHANGES_BATCH rows: SQLAlchemy's multi-row INSERT
                    target_conn.execute(table.insert(), rows)
    return len(taken)


def _counts(engine: sa.Engine, shard: int) -> tuple[int, int]:
    """(jobs, runs) of the shard on one database."""
    with engine.connect() as conn:
        found = [
            conn.execute(
                sa.select(sa.func.count()).select_from(table).where(table.c.shard == shard)
            ).scalar_one()
            for table, _key in TABLES
        ]
    return found[0], found[1]


def _verified_counts(source: sa.Engine, target: sa.Engine, shard: int, batch: int, echo) -> tuple[int, int]:
    """Both sides hold as many jobs and runs of the shard; otherwise copy it all again
    (the source is fenced: nothing changes under the copy) and check once more."""
    expected, found = _counts(source, shard), _counts(target, shard)
    if expected == found:
        return expected
    echo(f"counts differ (source {expected}, target {found}): copying the shard again under the fence")
    _delete_shard(target, shard, batch)
    _copy_shard(source, target, shard, batch)
    found = _counts(target, shard)
    if expected != found:
        raise MoveError(
            f"shard {shard}: the target holds {found} (jobs, runs), the source {expected}; "
            f"the map was not switched: run the move again or --abort it"
        )
    return expected


def _delete_shard(engine: sa.Engine, shard: int, batch: int) -> int:
    """Delete every row of the shard from one database, batch by batch (keyset by key)."""
    total = 0
    for table, key in TABLES:
        last = None
        while True:
            chosen = sa.select(key).where(table.c.shard == shard).order_by(key).limit(batch)
            if last is not None:
                chosen = chosen.where(key > last)
            with engine.begin() as conn:
                conn.exec_driver_sql(BYPASS)
                doomed = table.delete().where(key.in_(chosen.scalar_subquery())).returning(key)
                gone = conn.execute(doomed).scalars().all()
            if not gone:
                break
            total += len(gone)
            last = max(gone)
    return total
