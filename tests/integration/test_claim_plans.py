"""The claim's plans where the planner has no statistics: a module of its own, so its
database is fresh (cloned from the migrated template and never analyzed, the indexes
as empty as `punctual migrate` made them), which is what a registry filled since its
last ANALYZE looks like to the planner."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.timefmt import utcnow
from app.pollers.claim import due_jobs, due_owners, fair_due_jobs
from app.registry.engines import registry_for
from tests.integration.plans import PLAIN_DUE_INDEX
from tests.rows import insert_jobs, job_row

pytestmark = pytest.mark.integration


SHARD = 3
OWNERS = 1000


def _plan(conn, stmt) -> str:
    compiled = stmt.compile(conn, compile_kwargs={"literal_binds": True})
    return "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}").scalars().all())


@pytest.fixture(scope="module")
def unanalyzed(pg_dsns, pg_shards):
    from app.settings import Settings

    settings = Settings.from_env(
        {"PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns), "PUNCTUAL_SHARDS": str(pg_shards)}
    )
    registry = registry_for(settings)
    due = utcnow() - timedelta(seconds=5)
    insert_jobs(
        registry,
        [
            job_row(pg_shards, owner=f"owner-{i:04}", run_at=due, shard=SHARD)
            for i in range(OWNERS)
            for _ in range(5)
        ],
    )
    return registry.engine_for_shard(SHARD)


def _fair_claim(conn):
    owners = conn.execute(due_owners(SHARD, utcnow())).scalars().all()
    assert len(owners) == OWNERS
    return fair_due_jobs(SHARD, utcnow(), [(owner, 1) for owner in owners[:500]])


def test_each_owners_share_is_probed_through_its_own_index(unanalyzed):
    with unanalyzed.connect() as conn:
        plan = _plan(conn, _fair_claim(conn))
    assert "using ix_jobs_due_by_owner on" in plan and not PLAIN_DUE_INDEX.search(plan), plan


def test_the_plain_due_index_is_no_candidate_for_the_per_owner_probe(unanalyzed):
    """Even with ix_jobs_due_by_owner gone (dropped inside a transaction that is rolled
    back), the probe does not take ix_jobs_due: its predicate states a bound that the
    probe does not. Where both looked empty the planner took it, and each probe read
    the shard's whole due range, filtering by owner (migration 0007)."""
    with unanalyzed.connect() as conn:
        statement = _fair_claim(conn)
        conn.exec_driver_sql("DROP INDEX ix_jobs_due_by_owner")
        plan = _plan(conn, statement)
        conn.rollback()
    assert not PLAIN_DUE_INDEX.search(plan), plan


def test_the_oldest_first_claim_still_scans_the_due_index(unanalyzed):
    with unanalyzed.connect() as conn:
        plan = _plan(conn, due_jobs(SHARD, utcnow(), 500))
    assert PLAIN_DUE_INDEX.search(plan) and "Seq Scan" not in plan, plan
