"""Retention: finished runs older than PUNCTUAL_HISTORY_DAYS go, dead letters too;
runs in flight and recent history stay; a locked row is skipped, never waited for."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.pollers.retention import prune
from app.registry.engines import Registry
from app.registry.records import run_row
from app.registry.schema import runs
from tests.rows import job_row

pytestmark = pytest.mark.integration

SHARD = 4


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    reg = Registry(pg_settings)
    yield reg
    reg.dispose()


def history(registry: Registry, states_and_ages: list[tuple[str, float | None]]) -> list:
    """One run per (state, days since it finished; None: not finished) on SHARD."""
    job = job_row(16, shard=SHARD, run_at=utcnow())
    now = utcnow()
    rows = []
    for state, age_days in states_and_ages:
        finished = None if age_days is None else now - timedelta(days=age_days)
        rows.append(
            run_row(
                job_id=job["job_id"],
                shard=SHARD,
                owner="tests",
                origin="schedule",
                scheduled_for=finished or now,
                attempt=1,
                state=state,
                target=job["target"],
                retry={},
                now=finished or now,
                finished_at=finished,
                leased_until=None if finished else now + timedelta(seconds=60),
            )
        )
    with registry.engine_for_shard(SHARD).begin() as conn:
        conn.execute(runs.insert(), rows)
    return [row["run_id"] for row in rows]


def remaining(registry: Registry) -> set:
    with registry.engine_for_shard(SHARD).connect() as conn:
        return set(conn.execute(sa.select(runs.c.run_id).where(runs.c.shard == SHARD)).scalars())


def test_finished_runs_older_than_the_history_go_and_the_rest_stay(registry):
    old = history(
        registry, [("succeeded", 31), ("failed", 40), ("dead", 31), ("skipped", 90), ("replayed", 31)]
    )
    kept = history(registry, [("succeeded", 29), ("dead", 1), ("running", None), ("claimed", None)])
    assert prune(registry.engine_for_shard(SHARD), SHARD, utcnow(), 30) == len(old)
    assert remaining(registry) == set(kept)


def test_a_fraction_of_a_day_counts(registry):
    old = history(registry, [("succeeded", 0.6)])
    kept = history(registry, [("succeeded", 0.4)])
    assert prune(registry.engine_for_shard(SHARD), SHARD, utcnow(), 0.5) == 1
    assert remaining(registry) == set(kept) and not set(old) & remaining(registry)


def test_a_big_history_goes_in_batches_within_the_budget(registry):
    history(registry, [("succeeded", 60)] * 2500)
    engine = registry.engine_for_shard(SHARD)
    statements = []

    def seen(_conn, _cursor, statement, *_rest):
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        assert prune(engine, SHARD, utcnow(), 30, batch=1000, budget_s=60) == 2500
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    assert sum("DELETE FROM runs" in s for s in statements) == 3
    assert remaining(registry) == set()


def test_a_run_someone_holds_is_skipped_not_waited_for(registry):
    held, free = history(registry, [("dead", 31), ("succeeded", 31)])
    engine = registry.engine_for_shard(SHARD)
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():  # as a replay holds the dead run it replays
        with engine.begin() as conn:
            conn.execute(sa.select(runs.c.run_id).where(runs.c.run_id == held).with_for_update())
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    locked.wait(10)
    try:
        started = time.monotonic()
        assert prune(engine, SHARD, utcnow(), 30) == 1
        assert time.monotonic() - started < 10  # it did not wait for the holder (which waits 30 s)
    finally:
        release.set()
        holder.join()
    assert remaining(registry) == {held}


def test_the_prune_uses_the_finished_at_index(registry):
    from app.pollers.retention import expired_runs

    with registry.engine_for_shard(SHARD).connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        query = expired_runs(SHARD, utcnow(), 1000)
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                sa.text("EXPLAIN " + str(query.compile(conn, compile_kwargs={"literal_binds": True})))
            )
        )
    assert "ix_runs_finished" in plan, plan


def test_the_shard_sweep_prunes(registry, pg_settings):
    from app.tasks.shard import sweep_shard

    history(registry, [("succeeded", 31), ("dead", 45)])
    kept = history(registry, [("succeeded", 1)])
    report = sweep_shard(pg_settings, registry.engine_for_shard(SHARD), SHARD, lambda *a: None)
    assert report["pruned"] == 2 and remaining(registry) == set(kept)
