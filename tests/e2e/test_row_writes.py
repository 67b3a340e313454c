"""The row writes of a burst, counted: at most four a successful one-off run
(docs/design.md "Writes per run"), and one run row per job.

A real worker and beat fire 1,000 one-offs due at one instant at a sink; the rows
the registry inserted, updated and deleted meanwhile come from pg_stat_user_tables
(every table of every database), read before the burst and once the counts are
flushed after it. A backend flushes its counts when it goes idle (at most a few
seconds later, or sooner when asked: pg_stat_force_next_flush), and a transaction
reads a snapshot of them (pg_stat_clear_snapshot), so the count after is read until
it stops moving.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.registry.engines import create_engine_for, registry_for
from app.registry.schema import jobs, runs
from tests.e2e.conftest import E2E_SHARDS, make_env
from tests.rows import job_row, webhook_target

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix):
    """The shipped lease and heartbeat (the tier's are shorter, which renews more)."""
    return make_env(pg_dsns, amqp_url, module_redis_prefix, PUNCTUAL_LEASE_S="20", PUNCTUAL_HEARTBEAT_S="5")


BURST = 1_000
MAX_WRITES_PER_RUN = 4
# A backend with counts to flush flushes them within this while of going idle.
FLUSHED_WITHIN_S = 12.0

_COUNTS = sa.text(
    "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0), "
    "coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables"
)


def _counts(engines) -> tuple[int, int, int, int]:
    """(inserted, updated, deleted, of which HOT updates) rows over every database, fresh."""
    total = [0, 0, 0, 0]
    for engine in engines:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            for index, value in enumerate(conn.execute(_COUNTS).one()):
                total[index] += int(value)
    return total[0], total[1], total[2], total[3]


def _settled(engines) -> tuple[int, int, int, int]:
    """The counts once every backend flushed its own: unchanged for FLUSHED_WITHIN_S."""
    last, since = _counts(engines), time.monotonic()
    while time.monotonic() - since < FLUSHED_WITHIN_S:
        time.sleep(1.0)
        now = _counts(engines)
        if now != last:
            last, since = now, time.monotonic()
    return last


def test_a_burst_writes_at_most_four_rows_a_run(stack, api, sink, settings, pg_dsns):
    registry = registry_for(settings)
    engines = [create_engine_for(dsn, pool_size=1) for dsn in pg_dsns]
    try:
        # Due once the counts before are read: an idle backend's flush may come a while later.
        due = utcnow() + timedelta(seconds=settings.claim_ahead_s + 4 * FLUSHED_WITHIN_S)
        rows = [
            job_row(E2E_SHARDS, owner="e2e", run_at=due, target=webhook_target(sink.url("/burst")))
            for _ in range(BURST)
        ]
        by_database: dict[int, list[dict]] = {}
        for row in rows:
            by_database.setdefault(registry.database_index(row["shard"]), []).append(row)
        for index, group in by_database.items():
            with registry.engines[index].connect() as conn:
                with conn.begin():
                    conn.execute(jobs.insert(), group)
                conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
                conn.execute(sa.text("SELECT 1"))  # idle again: the insert's counts go out
        before = _settled(engines)
        assert utcnow() < due - timedelta(seconds=settings.claim_ahead_s), (
            "counted too late: raise the margin"
        )

        sink.wait_for(BURST, "/burst", timeout_s=120)
        deadline = time.monotonic() + 60
        while True:
            with_rows = 0
            for engine in engines:
                with engine.connect() as conn:
                    with_rows += conn.execute(
                        sa.select(sa.func.count()).select_from(jobs).where(jobs.c.state == "completed")
                    ).scalar()
            if with_rows == BURST or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        after = _settled(engines)

        history: list = []
        for engine in engines:
            with engine.connect() as conn:
                history += conn.execute(sa.select(runs.c.job_id, runs.c.state)).all()
        assert sorted(job_id for job_id, _ in history) == sorted(row["job_id"] for row in rows)
        assert {state for _, state in history} == {"succeeded"}
        assert with_rows == BURST

        inserted, updated, deleted = (after[i] - before[i] for i in range(3))
        writes = inserted + updated + deleted
        hot = after[3] - before[3]
        print(f"{BURST} runs: {inserted} inserted, {updated} updated ({hot} HOT), {deleted} deleted")
        assert writes <= MAX_WRITES_PER_RUN * BURST, (inserted, updated, deleted)
    finally:
        for engine in engines:
            engine.dispose()
        registry.dispose()
