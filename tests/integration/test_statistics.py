"""The sweep keeps the planner's statistics (app.registry.statistics) on real Postgres:
a shard database filled since its last ANALYZE is analyzed once, the fair claim then
probes each owner through ix_jobs_due_by_owner, and a database that is up to date, or
was checked a moment ago, is left alone."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.pollers.claim import due_owners, fair_due_jobs
from app.pollers.shares import fair_shares
from app.registry import statistics
from app.registry.engines import registry_for
from tests.rows import insert_jobs, job_row

pytestmark = pytest.mark.integration

SHARD = 3


def _analyzed_until_counted(engine, timeout_s: float = 10.0) -> list[str]:
    """analyze_if_stale, asked again while the server has not yet counted the writes
    (a backend reports its counters up to a second after its commit)."""
    deadline = time.monotonic() + timeout_s
    while True:
        analyzed = statistics.analyze_if_stale(engine, force_check=True)
        if analyzed or time.monotonic() > deadline:
            return analyzed
        time.sleep(0.2)


def _last_analyze(engine) -> dict:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT relname, last_analyze FROM pg_stat_user_tables WHERE relname IN ('jobs', 'runs')")
        )
        return {row.relname: row.last_analyze for row in rows}


def _fair_claim_plan(engine) -> str:
    horizon = utcnow()
    with engine.connect() as conn:
        owners = conn.execute(due_owners(SHARD, horizon)).scalars().all()
        shares = fair_shares(owners, {}, 500).takes
        compiled = fair_due_jobs(SHARD, horizon, shares).compile(conn, compile_kwargs={"literal_binds": True})
        return "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}").scalars().all())


def test_a_database_filled_since_its_last_analyze_is_analyzed_once_and_the_claim_probes_by_owner(
    pg_settings, truncate
):
    truncate()
    registry = registry_for(pg_settings)
    engine = registry.engine_for_shard(SHARD)
    statistics.analyze_if_stale(engine, force_check=True)  # whatever earlier writes left
    due = utcnow() - timedelta(seconds=5)
    insert_jobs(
        registry,
        [job_row(16, owner=f"owner-{i:04}", run_at=due, shard=SHARD) for i in range(1000) for _ in range(5)],
    )

    assert _analyzed_until_counted(engine) == ["jobs"]
    assert _last_analyze(engine)["jobs"] is not None
    plan = _fair_claim_plan(engine)
    assert "ix_jobs_due_by_owner" in plan and "ix_jobs_due " not in plan, plan
    # Analyzed: nothing left to do, however often it is asked.
    assert statistics.analyze_if_stale(engine, force_check=True) == []


def test_a_database_checked_a_moment_ago_is_not_checked_again(pg_settings, truncate):
    truncate()
    registry = registry_for(pg_settings)
    engine = registry.engine_for_shard(SHARD)
    statistics.analyze_if_stale(engine, force_check=True)  # starts the CHECK_EVERY_S wait
    insert_jobs(registry, [job_row(16, owner="a", run_at=utcnow(), shard=SHARD) for _ in range(500)])
    time.sleep(1.5)  # the writes are counted by now

    assert statistics.analyze_if_stale(engine) == []  # within CHECK_EVERY_S: not even looked at
    assert _analyzed_until_counted(engine) == ["jobs"]


def test_the_embedded_registry_has_nothing_to_analyze(tmp_path):
    from app.registry.engines import create_engine_for

    engine = create_engine_for(f"sqlite:///{tmp_path / 'registry.db'}")
    assert statistics.analyze_if_stale(engine, force_check=True) == []
