"""The heartbeat locks its rows in key order, as the completion does: the two cannot deadlock.

A heartbeat covers every run in flight, the runs whose calls ended and whose completion
is being written among them; the completion locks its runs in key order
(bulk.locked_in_key_order), after its jobs. An UPDATE locks rows in the order its plan meets them,
and for a batch larger than its recordset's estimate that is a bitmap heap scan:
the order the rows lie in the table. A heartbeat and a completion each holding a row
the other wanted waited for PostgreSQL's deadlock_timeout (a second), and one of them
was sent again (it happened in bench.limits and bench.dispatch runs).

Each test below leaves the batch's lowest key locked by another transaction (a
completion that got that far), lets the write run until it waits for that row, and
then asks for the batch's other rows without waiting. A writer that locks in key
order holds none of them yet. The first test checks the premise, so that the second
can fail: a plain bulk UPDATE of the same batch, its rows lying in the table in
descending key order, holds other rows while it waits.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from app.lifecycle import lease
from app.registry.bulk import Update, update_together
from app.registry.engines import create_engine_for, statement_connection
from app.registry.schema import runs

pytestmark = pytest.mark.integration

JOBS = 2_000
BATCH = 150  # more than a recordset's estimate of 100 rows: the plan hashes the recordset


@pytest.fixture
def leased(pg_dsns):
    """JOBS started runs written in descending key order (so the table holds them in
    that order): (engine, the BATCH lowest keys' rows {run_id, lease_token})."""
    engine = create_engine_for(pg_dsns[0], pool_size=3)
    with engine.begin() as conn:
        # A fresh heap each time (no dead rows of the test before): the rows lie as written.
        conn.exec_driver_sql("TRUNCATE runs")
        conn.exec_driver_sql(
            f"""
            INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state,
                lease_token, leased_until, published, started_at, created_at, updated_at)
            SELECT md5(i::text)::uuid, md5('job' || i)::uuid, 0, 'owner', 'schedule', now(), 1,
                   'running', md5('lease' || i)::uuid, now() + interval '1 minute', true, now(), now(),
                   now()
            FROM generate_series(1, {JOBS}) AS i
            ORDER BY 1 DESC
            """
        )
        conn.exec_driver_sql("ANALYZE runs")
        rows = conn.execute(
            sa.select(runs.c.run_id, runs.c.lease_token).order_by(runs.c.run_id).limit(BATCH)
        ).all()
    yield engine, [{"run_id": run_id, "lease_token": token} for run_id, token in rows]
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE runs")
    engine.dispose()


def _run_ids(rows: list[dict]) -> list:
    return [row["run_id"] for row in rows]


def _until() -> dict:
    return {"leased_until": datetime.now(UTC) + timedelta(seconds=60)}


def _plain_update(engine, rows: list[dict]) -> list:
    """The heartbeat's write of the runs without the lock in key order:

    UPDATE runs SET leased_until = :leased_until FROM jsonb_to_recordset(:rows) AS v(run_id uuid,
    lease_token uuid) WHERE runs.run_id = v.run_id AND runs.run_id = ANY(:keys) AND runs.lease_token
    IS NOT DISTINCT FROM v.lease_token AND v.lease_token IS NOT NULL RETURNING runs.run_id;
    """
    update = Update(runs, rows, match=("run_id", "lease_token"), constants=_until(), returning="run_id")
    with statement_connection(engine) as conn:
        return update_together(conn, [update])[0]


def _heartbeat(engine, rows) -> list:
    return lease._heartbeat_on(engine, {0}, rows, _until())


def _rows_held_while_waiting(engine, keys: list, write) -> tuple[int, Any]:
    """With the lowest of the batch's run `keys` (in key order) locked elsewhere, run
    `write()` until it waits for that row; then (how many of the other rows it holds,
    what it returned once that row was let go)."""
    key = runs.c.run_id
    lowest, others = keys[0], keys[1:]
    result: list = []
    holder = engine.connect()
    try:
        holder.execute(sa.select(key).where(key == lowest).with_for_update())
        writer = threading.Thread(target=lambda: result.append(write()))
        writer.start()
        _wait_for_a_lock_wait(engine)
        held = 0
        for run_id in others:  # a row the waiting writer holds cannot be had without waiting
            try:
                with holder.begin_nested():
                    holder.execute(sa.select(key).where(key == run_id).with_for_update(nowait=True))
            except sa.exc.OperationalError as exc:
                assert isinstance(exc.orig, psycopg.errors.LockNotAvailable)
                held += 1
        holder.rollback()
        writer.join(10)
        assert not writer.is_alive()
    finally:
        holder.close()
    return held, result[0] if result else None


def _wait_for_a_lock_wait(engine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A statement of its own each time: a transaction reads pg_stat_activity once.
        with statement_connection(engine) as conn:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).scalar()
        if waiting:
            return
        time.sleep(0.01)
    raise AssertionError("the write never waited for the locked row")


def test_premise_a_plain_bulk_update_holds_rows_while_it_waits_for_another(leased):
    engine, rows = leased
    held, _ = _rows_held_while_waiting(engine, _run_ids(rows), lambda: _plain_update(engine, rows))
    assert held > 0


def test_a_heartbeat_waiting_for_a_row_holds_none_of_the_rows_after_it(leased):
    engine, rows = leased
    held, extended = _rows_held_while_waiting(engine, _run_ids(rows), lambda: _heartbeat(engine, rows))
    assert held == 0
    assert sorted(extended) == _run_ids(rows)
