"""The janitor on real Postgres: expired leases come back due, attempts are spent."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.lifecycle.message import DispatchRun
from app.pollers import janitor
from app.pollers.claim import claim_batch, queued_lease_s
from app.registry.engines import registry_for
from app.registry.schema import jobs
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def claimed(registry, row, start=True):
    insert_jobs(registry, [row])
    now = utcnow()
    [run] = claim_batch(registry.engine_for_shard(row["shard"]), row["shard"], now, registry.settings).runs
    if start:
        lease.start(registry, [run], now)
    return run


def expire_all(registry, shard, seconds_later):
    later = utcnow() + timedelta(seconds=seconds_later)
    return janitor.expire(
        registry.engine_for_shard(shard), shard, later, registry.settings, rand=lambda: 0.0
    ), later


def test_an_expired_lease_is_a_spent_attempt_and_the_job_is_due_at_once(registry):
    run = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=1))
    assert expire_all(registry, 1, 1)[0] == 0  # not expired yet
    count, later = expire_all(registry, 1, registry.settings.lease_s + 1)
    assert count == 1
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["lease_token"] is None
    assert after["attempt"] == 1 and after["misfire_exempt"] is True and after["next_run_at"] == later
    [failed] = runs_of(registry, run.job_id)
    assert failed["state"] == "failed" and failed["error"].startswith("lease expired")
    # The next claim starts attempt 2 of the same occurrence (same idempotency key).
    [again] = claim_batch(registry.engine_for_shard(1), 1, later, registry.settings).runs
    assert again.attempt == 2 and again.scheduled_for == run.scheduled_for


def test_the_old_workers_late_completion_changes_nothing(registry):
    run = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=2))
    expire_all(registry, 2, registry.settings.lease_s + 1)
    before = job(registry, run.job_id), runs_of(registry, run.job_id)
    report = complete(registry, [Finished(run, CallOutcome(status_code=200), utcnow())], utcnow())
    assert report.stale == 1 and (job(registry, run.job_id), runs_of(registry, run.job_id)) == before


def test_a_claimed_run_never_started_is_taken_back_too(registry):
    run = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=3), start=False)
    # Not started, it may wait a few leases in the broker (queued_lease_s), and no longer.
    assert expire_all(registry, 3, registry.settings.lease_s + 1)[0] == 0
    assert expire_all(registry, 3, queued_lease_s(registry.settings) + 1)[0] == 1
    # Never called (no row): no attempt spent, the occurrence is due again at once.
    assert runs_of(registry, run.job_id) == []
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["lease_token"] is None
    assert after["attempt"] == 0 and after["misfire_exempt"] is True
    # Its message, should it come now, starts nothing.
    assert lease.start(registry, [run], utcnow()) == set()


def test_exhausted_attempts_make_the_run_dead(registry):
    once = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), max_attempts=1, shard=4))
    start = utcnow().replace(microsecond=0) - timedelta(seconds=1)
    recurring = claimed(
        registry, job_row(16, interval_s=30, start_at=start, first=start, max_attempts=1, shard=4)
    )
    assert expire_all(registry, 4, registry.settings.lease_s + 1)[0] == 2
    assert job(registry, once.job_id)["state"] == "dead"
    assert runs_of(registry, once.job_id)[0]["state"] == "dead"
    moved = job(registry, recurring.job_id)
    assert moved["state"] == "scheduled" and moved["nominal_at"] == start + timedelta(seconds=30)


def test_a_paused_job_keeps_its_state_when_its_lease_expires(registry):
    run = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=5))
    with registry.engine_for_shard(5).begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job_id == run.job_id).values(state="paused"))
    expire_all(registry, 5, registry.settings.lease_s + 1)
    after = job(registry, run.job_id)
    assert after["state"] == "paused" and after["lease_token"] is None and after["attempt"] == 1


def test_an_off_schedule_run_with_an_expired_lease_gets_its_next_attempt(registry):
    from app.services.jobs import insert_run

    row = job_row(16, run_at=utcnow() + timedelta(hours=1), shard=6)
    insert_jobs(registry, [row])
    now = utcnow()
    with registry.engine_for_shard(6).begin() as conn:
        trigger = insert_run(
            conn,
            job(registry, row["job_id"]),
            origin="trigger",
            scheduled_for=now,
            now=now,
            lease_s=registry.settings.lease_s,
        )
    lease.start(registry, [DispatchRun.from_row(trigger, None)], now)
    count, later = expire_all(registry, 6, registry.settings.lease_s + 1)
    assert count == 1
    first, second = runs_of(registry, row["job_id"])
    assert first["state"] == "failed" and second["state"] == "claimed" and second["attempt"] == 2
    assert second["due_at"] == later and second["scheduled_for"] == now
    assert job(registry, row["job_id"])["state"] == "scheduled"


def test_heartbeats_keep_a_lease_alive(registry):
    run = claimed(registry, job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=8))
    later = utcnow() + timedelta(seconds=registry.settings.lease_s - 1)
    lease.heartbeat(registry, [run], later)
    [row] = runs_of(registry, run.job_id)  # a started run's lease is on its row
    assert row["leased_until"] == later + timedelta(seconds=registry.settings.lease_s)
    assert expire_all(registry, 8, registry.settings.lease_s + 1)[0] == 0
