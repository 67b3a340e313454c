"""Completion on real Postgres: batched, fenced by the lease token, no drift."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest
import sqlalchemy as sa

from app import metrics
from app.core.jitter import fire_at
from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.registry.schema import jobs, runs
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration

OK = CallOutcome(status_code=200)
HTTP_500 = CallOutcome(status_code=500)
HTTP_400 = CallOutcome(status_code=400)


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def started(registry, rows):
    """Insert due rows, claim them on their shards and start their runs."""
    insert_jobs(registry, rows)
    now = utcnow()
    found = []
    for shard in sorted({r["shard"] for r in rows}):
        found += claim_batch(registry.engine_for_shard(shard), shard, now, registry.settings).runs
    assert lease.start(registry, found, now) == {r.run_id for r in found}
    return sorted(found, key=lambda r: [row["job_id"] for row in rows].index(r.job_id))


def finish(registry, run, outcome, now=None):
    now = now or utcnow()
    return complete(registry, [Finished(run, outcome, now)], now, rand=lambda: 0.0)


def test_one_off_success_completes_the_job(registry):
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1))])
    report = finish(registry, run, OK)
    assert report.applied == 1 and report.stale == 0
    after = job(registry, run.job_id)
    assert after["state"] == "completed" and after["lease_token"] is None and after["next_run_at"] is None
    [history] = runs_of(registry, run.job_id)
    assert history["state"] == "succeeded" and history["status_code"] == 200 and history["finished_at"]
    assert history["started_at"] and history["lateness_ms"] >= 1000


def test_recurring_next_run_comes_from_the_scheduled_time_not_now(registry):
    """Invariant 6: a run finished five minutes late does not shift the schedule."""
    nominal = utcnow().replace(second=0, microsecond=0) - timedelta(minutes=1)
    [run] = started(registry, [job_row(16, cron="* * * * *", first=nominal, jitter_s=30, misfire="run_all")])
    finish(registry, run, OK, now=nominal + timedelta(minutes=5))
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["attempt"] == 0 and after["lease_token"] is None
    assert after["nominal_at"] == nominal + timedelta(minutes=1)
    assert after["next_run_at"] == fire_at(run.job_id, nominal + timedelta(minutes=1), 30)


def test_schedule_patched_during_the_run_applies_from_the_next_occurrence(registry):
    nominal = utcnow().replace(second=0, microsecond=0)
    [run] = started(registry, [job_row(16, cron="* * * * *", first=nominal - timedelta(minutes=1))])
    with registry.engine_for_shard(run.shard).begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job_id == run.job_id).values(cron="0 * * * *"))
    finish(registry, run, OK)
    following = job(registry, run.job_id)["nominal_at"]
    assert following.minute == 0 and following > run.scheduled_for


def test_a_one_offs_run_whose_job_became_recurring_in_flight_moves_the_job_on_by_its_new_schedule(registry):
    """The completion reads a one-off's job row narrowly; a job found recurring is read
    whole (its schedule decides the next occurrence)."""
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1))])
    assert not run.recurring
    with registry.engine_for_shard(run.shard).begin() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.job_id == run.job_id)
            .values(schedule_kind="cron", cron="0 * * * *", run_at=None)
        )
    finish(registry, run, OK)
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["lease_token"] is None
    assert after["nominal_at"].minute == 0 and after["nominal_at"] > run.scheduled_for


def test_failure_with_attempts_left_writes_the_retry_into_next_run_at(registry):
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1), backoff_s=10)])
    now = utcnow()
    finish(registry, run, HTTP_500, now=now)
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["attempt"] == 1 and after["misfire_exempt"] is True
    assert after["next_run_at"] == now + timedelta(seconds=5)  # 10 s x uniform(0.5, 1) with rand 0
    assert after["nominal_at"] == run.scheduled_for
    assert runs_of(registry, run.job_id)[0]["state"] == "failed"


def test_a_batch_of_several_shapes_settles_each_job_as_alone(registry):
    """A one-off done, a one-off to retry and a recurring job moved on, in one flush (job
    writes of two shapes): each job is written as a flush of its own writes it."""
    nominal = utcnow().replace(second=0, microsecond=0) - timedelta(minutes=1)
    done, retried, recurring = started(
        registry,
        [
            job_row(16, run_at=utcnow() - timedelta(seconds=1)),
            job_row(16, run_at=utcnow() - timedelta(seconds=1), backoff_s=10),
            job_row(16, cron="* * * * *", first=nominal, misfire="run_all"),
        ],
    )
    now = utcnow()
    batch = [Finished(done, OK, now), Finished(retried, HTTP_500, now), Finished(recurring, OK, now)]
    assert complete(registry, batch, now, rand=lambda: 0.0).applied == 3
    after = job(registry, done.job_id)
    assert after["state"] == "completed" and after["lease_token"] is None
    after = job(registry, retried.job_id)
    assert after["state"] == "scheduled" and after["attempt"] == 1 and after["lease_token"] is None
    assert after["next_run_at"] == now + timedelta(seconds=5)
    after = job(registry, recurring.job_id)
    assert after["state"] == "scheduled" and after["nominal_at"] == nominal + timedelta(minutes=1)
    assert after["lease_token"] is None


def test_retry_after_replaces_the_backoff(registry):
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1), backoff_s=100)])
    now = utcnow()
    finish(registry, run, CallOutcome(status_code=429, retry_after="7"), now=now)
    assert job(registry, run.job_id)["next_run_at"] == now + timedelta(seconds=7)


def test_fatal_answer_kills_a_one_off_at_once(registry):
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1))])
    dead_before = metrics.DEAD_LETTERS._value.get()
    finish(registry, run, HTTP_400)
    assert job(registry, run.job_id)["state"] == "dead"
    [history] = runs_of(registry, run.job_id)
    assert history["state"] == "dead" and history["status_code"] == 400 and "not retried" in history["error"]
    assert metrics.DEAD_LETTERS._value.get() == dead_before + 1


def test_dead_recurring_run_moves_the_job_to_its_next_occurrence(registry):
    nominal = utcnow().replace(microsecond=0) - timedelta(seconds=1)
    [run] = started(registry, [job_row(16, interval_s=60, start_at=nominal, first=nominal, max_attempts=1)])
    finish(registry, run, HTTP_500)
    after = job(registry, run.job_id)
    assert after["state"] == "scheduled" and after["nominal_at"] == nominal + timedelta(seconds=60)
    assert runs_of(registry, run.job_id)[0]["state"] == "dead"


def test_stale_token_changes_nothing_and_is_counted(registry):
    """Invariant 1: after the janitor (or anyone) took the lease, a late completion is void."""
    [run] = started(registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1))])
    with registry.engine_for_shard(run.shard).begin() as conn:
        conn.execute(
            sa.update(jobs).where(jobs.c.job_id == run.job_id).values(lease_token=None, state="scheduled")
        )
    before_job, before_runs = job(registry, run.job_id), runs_of(registry, run.job_id)
    stale_before = metrics.STALE_COMPLETIONS._value.get()
    report = finish(registry, run, OK)
    assert report.stale == 1 and report.applied == 0
    assert job(registry, run.job_id) == before_job and runs_of(registry, run.job_id) == before_runs
    assert metrics.STALE_COMPLETIONS._value.get() == stale_before + 1


def test_a_run_row_that_left_running_fences_its_completion_even_when_the_job_holds_the_token(registry):
    """The run's own UPDATE is the fence: a run no longer `running` (settled by an
    earlier completion or the janitor) changes nothing, not even its job, which
    here still holds the token."""
    fresh, settled = started(
        registry, [job_row(16, run_at=utcnow() - timedelta(seconds=1)) for _ in range(2)]
    )
    with registry.engine_for_shard(settled.shard).begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.run_id == settled.run_id).values(state="failed"))
    before_job, before_runs = job(registry, settled.job_id), runs_of(registry, settled.job_id)
    stale_before = metrics.STALE_COMPLETIONS._value.get()
    now = utcnow()
    report = complete(registry, [Finished(fresh, OK, now), Finished(settled, OK, now)], now)
    assert report.applied == 1 and report.stale == 1
    assert job(registry, settled.job_id) == before_job and runs_of(registry, settled.job_id) == before_runs
    assert job(registry, fresh.job_id)["state"] == "completed"
    assert metrics.STALE_COMPLETIONS._value.get() == stale_before + 1


def _started_trigger(registry):
    """A job due in an hour, and a triggered run of it, started now: (job row, run, now)."""
    from app.lifecycle.message import DispatchRun
    from app.services.jobs import insert_run

    row = job_row(16, run_at=utcnow() + timedelta(hours=1))
    insert_jobs(registry, [row])
    now = utcnow()
    with registry.engine_for_shard(row["shard"]).begin() as conn:
        trigger = insert_run(
            conn,
            job(registry, row["job_id"]),
            origin="trigger",
            scheduled_for=now,
            now=now,
            lease_s=registry.settings.lease_s,
        )
    run = DispatchRun.from_row(trigger, None)
    assert lease.start(registry, [run], now) == {run.run_id}
    return row, run, now


def test_an_off_schedule_run_whose_token_changed_inserts_no_retry(registry):
    row, run, now = _started_trigger(registry)
    with registry.engine_for_shard(run.shard).begin() as conn:  # taken back: a new token
        conn.execute(sa.update(runs).where(runs.c.run_id == run.run_id).values(lease_token=uuid.uuid4()))
    before = runs_of(registry, row["job_id"])
    report = finish(registry, run, HTTP_500, now=now)
    assert report.stale == 1 and report.applied == 0
    assert runs_of(registry, row["job_id"]) == before


def test_paused_and_cancelled_jobs_keep_their_state(registry):
    now = utcnow()
    rows = [
        job_row(16, interval_s=60, start_at=now - timedelta(seconds=1), first=now - timedelta(seconds=1))
        for _ in range(2)
    ]
    paused, cancelled = started(registry, rows)
    with registry.engine_for_shard(paused.shard).begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job_id == paused.job_id).values(state="paused"))
    with registry.engine_for_shard(cancelled.shard).begin() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.job_id == cancelled.job_id)
            .values(state="cancelled", next_run_at=None)
        )
    complete(registry, [Finished(paused, OK, now), Finished(cancelled, OK, now)], now)
    p, c = job(registry, paused.job_id), job(registry, cancelled.job_id)
    assert (
        p["state"] == "paused"
        and p["lease_token"] is None
        and p["nominal_at"] == paused.scheduled_for + timedelta(seconds=60)
    )
    assert c["state"] == "cancelled" and c["lease_token"] is None and c["next_run_at"] is None


def test_a_batch_is_one_transaction_per_physical_dsn(registry):
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1)) for _ in range(300)]
    found = started(registry, rows)
    assert len({registry.database_index(r.shard) for r in found}) == 2
    registry.map_refresh_s = 3600  # the map's version check is a read of its own; not counted here
    begins = []
    listeners = [(engine, lambda conn, e=engine: begins.append(e)) for engine in registry.engines]
    for engine, fn in listeners:
        sa.event.listen(engine, "begin", fn)
    try:
        now = utcnow()
        report = complete(registry, [Finished(r, OK, now) for r in found], now)
    finally:
        for engine, fn in listeners:
            sa.event.remove(engine, "begin", fn)
    assert report.applied == 300 and len(begins) == 2
    assert {job(registry, r.job_id)["state"] for r in found[:20]} == {"completed"}


def test_off_schedule_failure_inserts_the_next_attempt_and_leaves_the_job(registry):
    row, run, now = _started_trigger(registry)
    finish(registry, run, HTTP_500, now=now)
    first, second = runs_of(registry, row["job_id"])
    assert first["state"] == "failed" and second["state"] == "claimed" and second["attempt"] == 2
    assert second["scheduled_for"] == now and second["origin"] == "trigger" and second["published"] is False
    assert second["due_at"] == now + timedelta(seconds=5)
    assert job(registry, row["job_id"]) == {
        **job(registry, row["job_id"]),
        "state": "scheduled",
        "lease_token": None,
    }


def test_run_all_catch_up_jumps_past_the_skipped_range(registry):
    base = utcnow().replace(microsecond=0) - timedelta(seconds=30)
    row = job_row(16, interval_s=1, start_at=base, first=base, misfire="run_all")
    row.update(skipped_after=base, skipped_through=base + timedelta(seconds=10))
    [run] = started(registry, [row])
    finish(registry, run, OK)
    after = job(registry, run.job_id)
    assert after["nominal_at"] == base + timedelta(seconds=11)
    assert after["skipped_after"] is None and after["skipped_through"] is None


def test_the_next_occurrence_follows_the_jobs_zone_and_is_stored_in_utc(registry):
    """Invariant 7: 09:00 in New York is 14:00Z before the spring change and 13:00Z after it."""
    from datetime import datetime

    before_change = datetime(2026, 3, 7, 14, 0, tzinfo=UTC)
    row = job_row(16, cron="0 9 * * *", first=before_change, misfire="run_all")
    row["timezone"] = "America/New_York"
    [run] = started(registry, [row])
    finish(registry, run, OK)
    after = job(registry, run.job_id)
    assert after["nominal_at"] == datetime(2026, 3, 8, 13, 0, tzinfo=UTC)
    assert after["nominal_at"].utcoffset() == timedelta(0)


def test_a_hostile_answer_in_a_batch_is_recorded_as_failed_and_the_others_are_written(registry):
    """Nothing a target sends fails the batch: a Retry-After of 400 digits, a status no
    HTTP status is, a reason with NUL and lone surrogates and a megabyte of text."""
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1)) for _ in range(5)]
    found = started(registry, rows)
    now = utcnow()
    outcomes = [
        CallOutcome(status_code=503, retry_after="9" * 400),
        CallOutcome(status_code=10**6),
        CallOutcome(error="connection failed: \x00\ud800" + "x" * 1_000_000),
        CallOutcome(status_code=503, retry_after="Mon, 01 Jun 99999 12:00:00 GMT\x00"),
        OK,
    ]
    report = complete(
        registry, [Finished(run, o, now) for run, o in zip(found, outcomes, strict=True)], now, lambda: 0.0
    )
    assert report.applied == 5
    histories = [runs_of(registry, run.job_id)[0] for run in found]
    assert [h["state"] for h in histories] == ["failed", "failed", "failed", "failed", "succeeded"]
    # An unusable Retry-After: the job's own backoff (10 s x 0.5 with rand() = 0).
    assert job(registry, found[0].job_id)["next_run_at"] == now + timedelta(seconds=5)
    assert job(registry, found[3].job_id)["next_run_at"] == now + timedelta(seconds=5)
    assert histories[1]["status_code"] is None
    reason = "the answer could not be settled (ValueError: status '1000000' is not an HTTP status)"
    assert histories[1]["error"] == reason
    error = histories[2]["error"]
    assert (
        len(error) == 1000
        and error.startswith("connection failed: \ufffd\ufffdxxx")
        and error[-1] == "\u2026"
    )
