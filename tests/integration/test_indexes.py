"""Invariant 5: "what is due" and "whose lease expired" are index range scans, never table scans."""

from __future__ import annotations

import pytest

from app.registry.engines import create_engine_for
from tests.integration.plans import PLAIN_DUE_INDEX

pytestmark = pytest.mark.integration


ROWS = 200_000


@pytest.fixture(scope="module")
def big_registry(pg_dsns):
    """200k jobs over 16 shards: most scheduled in the future, some due, some leased, some
    finished; one in a thousand labelled team:rare, the others team:common."""
    engine = create_engine_for(pg_dsns[0], pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"""
            INSERT INTO jobs (job_id, shard, owner, name, target, schedule_kind, cron, timezone,
                retry_max_attempts, retry_backoff_s, retry_max_backoff_s, misfire, dst_gap, dst_overlap,
                jitter_s, state, next_run_at, nominal_at, attempt, lease_token, leased_until,
                created_at, updated_at, labels)
            SELECT md5(i::text)::uuid, mod(i, 16), 'owner-' || (mod(i, 50)), 'job-' || i,
                   '{{"type": "webhook", "url": "https://example.com/"}}'::jsonb, 'cron', '* * * * *', 'UTC',
                   5, 10, 3600, 'run_once', 'shift', 'once', 0,
                   CASE WHEN mod(i, 10) = 0 THEN 'completed' WHEN mod(i, 50) = 1 THEN 'running'
                        ELSE 'scheduled' END,
                   now() + (mod(i, 86400)) * interval '1 second' - interval '60 seconds',
                   now() + (mod(i, 86400)) * interval '1 second' - interval '60 seconds', 0,
                   CASE WHEN mod(i, 50) = 1 THEN md5('lease' || i)::uuid END,
                   CASE WHEN mod(i, 50) = 1 THEN now() + (mod(i, 120)) * interval '1 second' END,
                   now() - (i * interval '1 second'), now(),
                   CASE WHEN mod(i, 1000) = 7 THEN '{{"team": "rare"}}' ELSE '{{"team": "common"}}' END::jsonb
            FROM generate_series(1, {ROWS}) AS i
            """
        )
        conn.exec_driver_sql("ANALYZE jobs")
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs")
    engine.dispose()


def _plan(engine, sql: str) -> str:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + sql).scalars().all()
    return "\n".join(rows)


def test_the_due_query_is_an_index_range_scan(big_registry):
    plan = _plan(
        big_registry,
        "SELECT job_id FROM jobs WHERE shard = 3 AND state = 'scheduled' "
        "AND next_run_at > '0001-01-01 00:00:00+00' AND next_run_at <= now() "
        "ORDER BY next_run_at LIMIT 500 FOR UPDATE SKIP LOCKED",
    )
    assert PLAIN_DUE_INDEX.search(plan), plan
    assert "Seq Scan" not in plan, plan


def test_the_expired_lease_query_is_an_index_range_scan(big_registry):
    plan = _plan(
        big_registry,
        "SELECT job_id FROM jobs WHERE shard = 3 AND lease_token IS NOT NULL AND leased_until < now() "
        "ORDER BY leased_until LIMIT 500 FOR UPDATE SKIP LOCKED",
    )
    assert "ix_jobs_leased" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_listing_an_owners_jobs_newest_first_is_an_index_scan(big_registry):
    plan = _plan(
        big_registry,
        "SELECT job_id FROM jobs WHERE owner = 'owner-7' ORDER BY created_at DESC, job_id DESC LIMIT 101",
    )
    assert "ix_jobs_owner_created" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_a_rare_label_is_found_through_the_label_index(big_registry):
    plan = _plan(
        big_registry,
        """SELECT job_id FROM jobs WHERE owner = 'owner-7' AND labels @> '{"team": "rare"}'::jsonb """
        "ORDER BY created_at DESC, job_id DESC LIMIT 101",
    )
    assert "ix_jobs_labels" in plan, plan
    assert "Seq Scan" not in plan, plan
