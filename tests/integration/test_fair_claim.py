"""The fair claim on real Postgres: owners take turns within a shard's batch, by weight,
with the same guarantees as the plain claim (SKIP LOCKED, one claim per row), and the
query stays index scans (invariant 5)."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest

from app.core.timefmt import utcnow
from app.pollers import claim
from app.pollers.claim import claim_batch, due_owners, fair_due_jobs
from app.registry.engines import create_engine_for, registry_for
from tests.rows import insert_jobs, job_row

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    claim._last_served.clear()  # each test starts the owners' turns afresh
    return registry_for(pg_settings)


def _owners(result) -> Counter:
    return Counter(run.owner for run in result.runs)


def test_an_owner_with_few_due_rows_gets_them_in_the_next_batch_whatever_another_has_waiting(
    registry, pg_settings
):
    now = utcnow()
    # A's 1,200 rows are all older than B's 5: the oldest-first claim would take 1,200 of A first.
    backlog = [job_row(16, owner="a", run_at=now - timedelta(seconds=60), shard=2) for _ in range(1200)]
    late = [job_row(16, owner="b", run_at=now - timedelta(seconds=1), shard=2) for _ in range(5)]
    insert_jobs(registry, backlog + late)
    engine = registry.engine_for_shard(2)

    first = claim_batch(engine, 2, now, pg_settings, limit=100)

    assert _owners(first) == {"a": 50, "b": 5} and first.full
    # B has nothing left: A alone gets whole batches again.
    assert _owners(claim_batch(engine, 2, now, pg_settings, limit=100)) == {"a": 100}


def test_weights_share_each_batch_in_proportion(registry, pg_settings):
    now = utcnow()
    insert_jobs(
        registry,
        [
            job_row(16, owner=owner, run_at=now - timedelta(seconds=5), shard=1)
            for owner in ("heavy", "light")
            for _ in range(300)
        ],
    )
    engine = registry.engine_for_shard(1)

    result = claim_batch(engine, 1, now, pg_settings, limit=200, weights={"heavy": 3})

    assert _owners(result) == {"heavy": 150, "light": 50}


def test_more_owners_than_the_batch_holds_are_served_in_turn_across_batches(registry, pg_settings):
    now = utcnow()
    owners = [f"o{i:02}" for i in range(30)]
    insert_jobs(
        registry,
        [
            job_row(16, owner=owner, run_at=now - timedelta(seconds=30 - i), shard=5)
            for i, owner in enumerate(owners)
            for _ in range(2)
        ],
    )
    engine = registry.engine_for_shard(5)

    first = claim_batch(engine, 5, now, pg_settings, limit=20)
    second = claim_batch(engine, 5, now, pg_settings, limit=20)

    # The batch cannot give every owner a row: owners take turns, the next batch goes on
    # with those left out before anyone gets a second row.
    assert _owners(first) == {owner: 1 for owner in owners[:20]} and first.full
    assert _owners(second) == {owner: 1 for owner in owners[20:] + owners[:10]}


def test_two_pollers_claim_each_row_once_with_owners_mixed(registry, pg_settings):
    now = utcnow()
    rows = [
        job_row(16, owner=f"o{i % 7}", run_at=now - timedelta(seconds=i % 13), shard=4) for i in range(1400)
    ]
    insert_jobs(registry, rows)
    engine = registry.engine_for_shard(4)
    claimed: list = []
    lock = threading.Lock()

    def poller():
        while True:
            result = claim_batch(engine, 4, utcnow(), pg_settings, limit=50)
            with lock:
                claimed.extend(run.job_id for run in result.runs)
            if result.empty:
                return

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(claimed) == len(set(claimed)) == 1400


@pytest.fixture(scope="module")
def many_owners(pg_dsns):
    """200k jobs over 16 shards and 1,000 owners: most scheduled in the future, some due."""
    engine = create_engine_for(pg_dsns[0], pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs")
        conn.exec_driver_sql(
            """
            INSERT INTO jobs (job_id, shard, owner, name, target, schedule_kind, cron, timezone,
                retry_max_attempts, retry_backoff_s, retry_max_backoff_s, misfire, dst_gap, dst_overlap,
                jitter_s, state, next_run_at, nominal_at, attempt, created_at, updated_at)
            SELECT md5(i::text)::uuid, mod(i, 16), 'owner-' || (mod(i / 16, 1000)), 'job-' || i,
                   '{"type": "webhook", "url": "https://example.com/"}'::jsonb, 'cron', '* * * * *', 'UTC',
                   5, 10, 3600, 'run_once', 'shift', 'once', 0,
                   CASE WHEN mod(i, 10) = 0 THEN 'completed' ELSE 'scheduled' END,
                   now() + (mod(i, 86400)) * interval '1 second' - interval '60 seconds',
                   now() + (mod(i, 86400)) * interval '1 second' - interval '60 seconds', 0,
                   now() - (i * interval '1 second'), now()
            FROM generate_series(1, 200000) AS i
            """
        )
        conn.exec_driver_sql("ANALYZE jobs")
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs")
    engine.dispose()


def _plan(engine, stmt) -> str:
    with engine.connect() as conn:
        compiled = stmt.compile(conn, compile_kwargs={"literal_binds": True})
        return "\n".join(conn.exec_driver_sql(f"EXPLAIN {compiled}").scalars().all())


def test_listing_the_owners_with_due_rows_is_a_loose_index_scan(many_owners):
    plan = _plan(many_owners, due_owners(3, utcnow()))
    assert "Recursive Union" in plan, plan
    assert plan.count("ix_jobs_due_by_owner") == 2, plan  # the first probe and the one per next owner
    assert "Seq Scan on jobs" not in plan and "Sort" not in plan, plan


def test_the_fair_claim_is_an_index_range_scan_per_owner(many_owners):
    with many_owners.connect() as conn:
        owners = conn.execute(due_owners(3, utcnow())).scalars().all()
    shares = [(owner, 2) for owner in owners[:250]]
    plan = _plan(many_owners, fair_due_jobs(3, utcnow(), shares))
    assert "Nested Loop" in plan and "ix_jobs_due_by_owner" in plan, plan
    assert "LockRows" in plan, plan
    assert "Seq Scan on jobs" not in plan, plan


def test_the_embedded_registry_claims_fairly_too(tmp_path):
    from app.registry.migrate import migrate_all
    from app.settings import Settings

    settings = Settings.from_env({"PUNCTUAL_DATA_DIR": str(tmp_path), "PUNCTUAL_SHARDS": "1"})
    migrate_all(settings.database_urls, shards=settings.shards)
    registry = registry_for(settings)
    now = utcnow()
    backlog = [job_row(1, owner="a", run_at=now - timedelta(seconds=60)) for _ in range(300)]
    late = [job_row(1, owner="b", run_at=now - timedelta(seconds=1)) for _ in range(5)]
    insert_jobs(registry, backlog + late)

    first = claim_batch(registry.engine_for_shard(0), 0, now, settings, limit=100)

    try:
        assert _owners(first) == {"a": 50, "b": 5} and first.full
    finally:
        registry.dispose()
