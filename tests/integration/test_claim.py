"""The claim on real Postgres: batches, fencing tokens, SKIP LOCKED, misfires, the index."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.pollers.claim import claim_batch, due_jobs, queued_lease_s
from app.registry.engines import registry_for
from app.registry.migrate import migrate_all
from app.registry.schema import jobs
from app.settings import Settings
from tests.integration.plans import PLAIN_DUE_INDEX
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def test_claim_takes_due_rows_and_leases_them_on_their_jobs(registry, pg_settings):
    now = utcnow()
    due = job_row(16, run_at=now - timedelta(seconds=1), shard=3)
    later = job_row(16, run_at=now + timedelta(hours=1), shard=3)
    elsewhere = job_row(16, run_at=now - timedelta(seconds=1), shard=4)
    insert_jobs(registry, [due, later, elsewhere])

    result = claim_batch(registry.engine_for_shard(3), 3, now, pg_settings)

    assert [r.job_id for r in result.runs] == [due["job_id"]] and not result.full
    claimed = job(registry, due["job_id"])
    assert claimed["state"] == "running" and claimed["lease_token"] == result.runs[0].lease_token
    # A claimed run may wait in the broker for a few leases (it has not been called).
    assert claimed["leased_until"] == now + timedelta(seconds=queued_lease_s(pg_settings))
    # The run has no row until its start: it travels in its message alone.
    assert runs_of(registry, due["job_id"]) == []
    [run] = result.runs
    assert run.attempt == 1 and not run.leased_on_run
    assert run.scheduled_for == due["nominal_at"] and run.lease_token == claimed["lease_token"]
    assert run.target == due["target"] and run.retry["max_attempts"] == 5
    assert job(registry, later["job_id"])["state"] == "scheduled"
    assert job(registry, elsewhere["job_id"])["state"] == "scheduled"
    # Claimed rows are no longer due: a second claim finds nothing.
    assert claim_batch(registry.engine_for_shard(3), 3, now, pg_settings).empty


def test_a_job_due_within_the_claim_ahead_window_is_claimed_with_its_instant(registry, pg_settings):
    now = utcnow()
    soon = job_row(16, run_at=now + timedelta(seconds=5), shard=3)
    beyond = job_row(16, run_at=now + timedelta(seconds=pg_settings.claim_ahead_s + 1), shard=3)
    insert_jobs(registry, [soon, beyond])
    engine = registry.engine_for_shard(3)

    assert claim_batch(engine, 3, now, dataclasses.replace(pg_settings, claim_ahead_s=0)).empty
    [run] = claim_batch(engine, 3, now, pg_settings).runs

    assert run.job_id == soon["job_id"] and run.fire_at == soon["next_run_at"]
    claimed = job(registry, soon["job_id"])
    # The lease runs from the instant the run waits for, not from the claim.
    assert claimed["leased_until"] == soon["next_run_at"] + timedelta(seconds=queued_lease_s(pg_settings))
    assert claimed["next_run_at"] == soon["next_run_at"] and claimed["state"] == "running"
    assert job(registry, beyond["job_id"])["state"] == "scheduled"


def test_batches_are_at_most_claim_batch_and_oldest_first(registry, pg_settings):
    now = utcnow()
    rows = [job_row(16, run_at=now - timedelta(seconds=i), shard=5) for i in range(1, 1201)]
    insert_jobs(registry, rows)
    engine = registry.engine_for_shard(5)
    sizes = []
    first = claim_batch(engine, 5, now, pg_settings)
    sizes.append(len(first.runs))
    assert first.full
    oldest = sorted(rows, key=lambda r: r["next_run_at"])[:500]
    assert {r.job_id for r in first.runs} == {r["job_id"] for r in oldest}
    while True:
        result = claim_batch(engine, 5, now, pg_settings)
        sizes.append(len(result.runs))
        if not result.full:
            break
    assert sizes == [500, 500, 200]


def test_two_pollers_on_one_shard_claim_each_job_once(registry, pg_settings):
    """Invariant 4: SKIP LOCKED plus the state transition, no leader."""
    now = utcnow()
    rows = [job_row(16, run_at=now - timedelta(seconds=1), shard=7) for _ in range(2000)]
    insert_jobs(registry, rows)
    engine = registry.engine_for_shard(7)
    got: list[list] = [[], []]

    def poller(index: int) -> None:
        while True:
            result = claim_batch(engine, 7, utcnow(), pg_settings, limit=100)
            got[index].extend(r.job_id for r in result.runs)
            if result.empty:
                return

    threads = [threading.Thread(target=poller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claimed = got[0] + got[1]
    assert len(claimed) == 2000 and set(claimed) == {r["job_id"] for r in rows}
    assert got[0] and got[1]  # both did work
    with engine.connect() as conn:
        leased = conn.execute(
            sa.select(sa.func.count(sa.distinct(jobs.c.lease_token))).where(jobs.c.shard == 7)
        ).scalar()
    assert leased == 2000


def test_claim_query_is_an_index_range_scan(registry):
    """Invariant 5: what is due comes from ix_jobs_due, never a table scan."""
    engine = registry.engine_for_shard(0)
    insert_jobs(
        registry, [job_row(16, run_at=utcnow() + timedelta(days=i % 30), shard=0) for i in range(3000)]
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        compiled = due_jobs(0, utcnow(), 500).compile(engine, compile_kwargs={"literal_binds": True})
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}"))
    assert PLAIN_DUE_INDEX.search(plan) and "Seq Scan" not in plan, plan


def test_exempt_row_runs_its_own_occurrence_with_the_next_attempt(registry, pg_settings):
    now = utcnow()
    row = job_row(16, cron="* * * * * *", first=now - timedelta(minutes=10), shard=2)
    row.update(misfire_exempt=True, attempt=2, misfire="skip")
    insert_jobs(registry, [row])
    result = claim_batch(registry.engine_for_shard(2), 2, now, pg_settings)
    [run] = result.runs
    assert run.scheduled_for == row["nominal_at"] and run.attempt == 3
    assert runs_of(registry, row["job_id"]) == []


def _late_job(registry, policy: str, missed: int, shard: int) -> tuple[dict, object]:
    """A 1-second interval job whose cursor is `missed` + 1 s behind `now` (a whole second):
    occurrences now-missed-1 .. now are due, the first `missed` more than 1 s late."""
    now = utcnow().replace(microsecond=0)
    first = now - timedelta(seconds=missed + 1)
    row = job_row(
        16, interval_s=1, start_at=first, first=first, misfire=policy, shard=shard, created_at=first
    )
    insert_jobs(registry, [row])
    return row, now


@pytest.fixture
def grace_1s(pg_settings):
    return Settings(**{**pg_settings.__dict__, "misfire_grace_s": 1.0})


def test_misfire_run_once_runs_the_latest_and_records_the_rest_skipped(registry, grace_1s):
    row, now = _late_job(registry, "run_once", 3, shard=9)
    [run] = claim_batch(registry.engine_for_shard(9), 9, now, grace_1s).runs
    assert run.scheduled_for == now and run.attempt == 1
    states = [(r["scheduled_for"], r["state"]) for r in runs_of(registry, row["job_id"])]
    assert [s for _, s in states] == ["skipped"] * 4
    assert job(registry, row["job_id"])["nominal_at"] == now


def test_misfire_run_all_runs_the_oldest_first_and_skips_nothing(registry, grace_1s):
    row, now = _late_job(registry, "run_all", 3, shard=10)
    [run] = claim_batch(registry.engine_for_shard(10), 10, now, grace_1s).runs
    assert run.scheduled_for == row["nominal_at"]
    assert runs_of(registry, row["job_id"]) == []
    assert job(registry, row["job_id"])["skipped_after"] is None


def test_misfire_skip_runs_the_latest_within_the_grace_and_skips_the_rest(registry, grace_1s):
    row, now = _late_job(registry, "skip", 3, shard=11)
    [run] = claim_batch(registry.engine_for_shard(11), 11, now, grace_1s).runs
    assert run.scheduled_for == now
    assert [r["state"] for r in runs_of(registry, row["job_id"])] == ["skipped"] * 4


def test_misfire_skip_with_every_occurrence_late_records_them_and_moves_on(registry, grace_1s):
    now = utcnow().replace(microsecond=0)
    # A job on a 10 s grid whose last three occurrences are 2.5, 12.5 and 22.5 s late.
    start = now - timedelta(seconds=22.5)
    row = job_row(16, interval_s=10, start_at=start, first=start, misfire="skip", shard=12, created_at=start)
    insert_jobs(registry, [row])
    result = claim_batch(registry.engine_for_shard(12), 12, now, grace_1s)
    assert result.runs == [] and result.taken == 1
    history = runs_of(registry, row["job_id"])
    assert [r["state"] for r in history] == ["skipped"] * 3
    moved = job(registry, row["job_id"])
    assert moved["state"] == "scheduled" and moved["nominal_at"] == start + timedelta(seconds=30)


def test_less_than_the_grace_late_runs_late_under_every_policy(registry, grace_1s):
    now = utcnow()
    rows = []
    for policy in ("run_once", "run_all", "skip"):
        first = now - timedelta(seconds=0.5)
        row = job_row(
            16, interval_s=60, start_at=first, first=first, misfire=policy, shard=13, created_at=first
        )
        rows.append(row)
    insert_jobs(registry, rows)
    result = claim_batch(registry.engine_for_shard(13), 13, now, grace_1s)
    assert sorted(r.job_id for r in result.runs) == sorted(r["job_id"] for r in rows)
    assert all(r.scheduled_for == rows[0]["nominal_at"] for r in result.runs)


def test_run_all_over_the_cap_records_a_skipped_range(registry, grace_1s):
    now = utcnow().replace(microsecond=0)
    start = now - timedelta(seconds=1500)
    row = job_row(
        16, interval_s=1, start_at=start, first=start, misfire="run_all", shard=14, created_at=start
    )
    insert_jobs(registry, [row])
    [run] = claim_batch(registry.engine_for_shard(14), 14, now, grace_1s).runs
    assert run.scheduled_for == start
    claimed = job(registry, row["job_id"])
    assert claimed["skipped_after"] == start + timedelta(seconds=999)
    assert claimed["skipped_through"] == now
    skipped = [r for r in runs_of(registry, row["job_id"]) if r["state"] == "skipped"]
    assert 0 < len(skipped) <= 1000 and all(r["scheduled_for"] > claimed["skipped_after"] for r in skipped)


def test_the_same_claim_runs_on_sqlite(tmp_path):
    """Embedded mode: no FOR UPDATE / SKIP LOCKED, one poller, the same code."""
    dsn = f"sqlite:///{tmp_path / 'registry.sqlite3'}"
    migrate_all((dsn,), shards=1)
    settings = Settings.from_env({"PUNCTUAL_DATABASE_URLS": dsn, "PUNCTUAL_SHARDS": "1"})
    registry = registry_for(settings)
    now = utcnow()
    row = job_row(1, run_at=now - timedelta(seconds=1))
    insert_jobs(registry, [row])
    [run] = claim_batch(registry.engine_for_shard(0), 0, now, settings).runs
    assert run.job_id == row["job_id"] and job(registry, row["job_id"])["state"] == "running"
    registry.dispose()
