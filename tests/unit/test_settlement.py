"""Settling a finished attempt (pure): the completion and the janitor both apply these values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from app.core.jitter import fire_at
from app.core.retries import CallOutcome
from app.lifecycle.settlement import JOB_COLUMNS, Attempt, settle

NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
NOMINAL = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
RETRY = {"max_attempts": 3, "backoff_s": 10, "max_backoff_s": 100}


def job(**overrides) -> dict:
    values = {
        "job_id": uuid.UUID(int=5),
        "schedule_kind": "cron",
        "run_at": None,
        "cron": "* * * * *",
        "interval_s": None,
        "timezone": "UTC",
        "start_at": None,
        "end_at": None,
        "dst_gap": "shift",
        "dst_overlap": "once",
        "jitter_s": 20,
        "state": "running",
        "skipped_after": None,
        "skipped_through": None,
        "created_at": NOMINAL - timedelta(days=1),
        "overlap": "buffer_one",
        "rescheduled_at": None,
    }
    values.update(overrides)
    return values


def attempt(n=1, origin="schedule") -> Attempt:
    return Attempt(uuid.UUID(int=5), origin, NOMINAL, n, RETRY)


def zero() -> float:
    return 0.0


def test_success_moves_to_the_next_occurrence_from_the_scheduled_time():
    done = settle(attempt(), CallOutcome(status_code=204), job(), NOW + timedelta(minutes=10), zero)
    following = NOMINAL + timedelta(minutes=1)
    assert done.run_state == "succeeded" and done.retry_at is None
    assert done.job["nominal_at"] == following and done.job["next_run_at"] == fire_at(
        uuid.UUID(int=5), following, 20
    )
    assert done.job["state"] == "scheduled" and done.job["lease_token"] is None and done.job["attempt"] == 0


def test_a_retryable_failure_writes_the_backoff_into_next_run_at():
    done = settle(attempt(1), CallOutcome(status_code=503), job(), NOW, zero)
    assert done.run_state == "failed" and done.job["next_run_at"] == NOW + timedelta(seconds=5)
    assert done.job["attempt"] == 1 and done.job["misfire_exempt"] is True and "nominal_at" not in done.job


def test_exhausted_attempts_kill_a_one_off_and_move_a_recurring_job_on():
    once = settle(
        attempt(3), CallOutcome(error="timeout"), job(schedule_kind="once", run_at=NOMINAL), NOW, zero
    )
    assert once.dead and once.job["state"] == "dead" and once.job["next_run_at"] is None
    recurring = settle(attempt(3), CallOutcome(error="timeout"), job(), NOW, zero)
    assert recurring.dead and recurring.job["state"] == "scheduled"


def test_an_expired_lease_retries_at_once():
    done = settle(attempt(1), CallOutcome(error="lease expired"), job(), NOW, zero, retry_now=True)
    assert done.job["next_run_at"] == NOW


def test_paused_and_cancelled_jobs_keep_their_state():
    paused = settle(attempt(), CallOutcome(status_code=200), job(state="paused"), NOW, zero)
    assert "state" not in paused.job and paused.job["lease_token"] is None
    cancelled = settle(attempt(), CallOutcome(status_code=200), job(state="cancelled"), NOW, zero)
    assert "state" not in cancelled.job and "next_run_at" not in cancelled.job


def test_off_schedule_runs_never_touch_the_job():
    failed = settle(attempt(1, origin="trigger"), CallOutcome(status_code=500), None, NOW, zero)
    assert failed.job is None and failed.retry_at == NOW + timedelta(seconds=5)
    assert settle(attempt(1, origin="replay"), CallOutcome(status_code=200), None, NOW, zero).job is None


def test_the_skipped_range_is_stepped_over():
    done = settle(
        attempt(),
        CallOutcome(status_code=200),
        job(skipped_after=NOMINAL, skipped_through=NOMINAL + timedelta(minutes=30)),
        NOW,
        zero,
    )
    assert done.job["nominal_at"] == NOMINAL + timedelta(minutes=31)
    assert done.job["skipped_after"] is None and done.job["skipped_through"] is None


def test_an_end_also_ends_a_paused_job_but_never_a_cancelled_one():
    one_off = job(schedule_kind="once", run_at=NOMINAL, state="paused")
    succeeded = settle(attempt(), CallOutcome(status_code=200), one_off, NOW, zero)
    assert succeeded.job["state"] == "completed" and succeeded.job["next_run_at"] is None
    dead = settle(attempt(1), CallOutcome(status_code=400), one_off, NOW, zero)
    assert dead.job["state"] == "dead"
    past_end = job(state="paused", end_at=NOMINAL + timedelta(seconds=30))
    assert settle(attempt(), CallOutcome(status_code=200), past_end, NOW, zero).job["state"] == "completed"
    cancelled = settle(attempt(), CallOutcome(status_code=200), dict(one_off, state="cancelled"), NOW, zero)
    assert "state" not in cancelled.job


def test_a_schedule_changed_during_the_run_moves_on_strictly_after_the_change():
    """An occurrence of the new schedule between the run's instant and the change is
    not the job's: moving to it would fire the job at once."""
    changed = NOMINAL + timedelta(minutes=7, seconds=30)
    done = settle(attempt(), CallOutcome(status_code=200), job(rescheduled_at=changed), NOW, zero)
    assert done.job["nominal_at"] == NOMINAL + timedelta(minutes=8)
    earlier = settle(attempt(), CallOutcome(status_code=200), job(rescheduled_at=NOMINAL), NOW, zero)
    assert earlier.job["nominal_at"] == NOMINAL + timedelta(minutes=1)  # a change before the run: as ever


# --- overlap --------------------------------------------------------------------------


def test_a_skip_job_skips_what_fell_due_while_its_run_was_in_flight():
    from app.core.overlap import IN_FLIGHT

    later = NOMINAL + timedelta(minutes=4, seconds=10)  # four occurrences fell due meanwhile
    done = settle(attempt(), CallOutcome(status_code=200), job(overlap="skip", jitter_s=0), later, zero)
    assert [o.nominal for o in done.skipped] == [NOMINAL + timedelta(minutes=m) for m in range(1, 5)]
    assert done.unrecorded_skips == 0 and done.job["nominal_at"] == NOMINAL + timedelta(minutes=5)
    assert IN_FLIGHT == "a run of the job was in flight (overlap skip)"
    quick = settle(attempt(), CallOutcome(status_code=200), job(overlap="skip", jitter_s=0), NOW, zero)
    assert quick.skipped == () and quick.job["nominal_at"] == NOMINAL + timedelta(minutes=1)


def test_a_skip_job_after_a_long_run_records_at_most_the_cap_and_counts_the_rest():
    from app.lifecycle.cursor import SKIPPED_CAP

    every_second = job(overlap="skip", jitter_s=0, schedule_kind="interval", cron=None, interval_s=1)
    later = NOMINAL + timedelta(hours=1)
    done = settle(attempt(), CallOutcome(status_code=200), every_second, later, zero)
    assert len(done.skipped) == SKIPPED_CAP and done.unrecorded_skips == 3600 - SKIPPED_CAP
    assert done.job["nominal_at"] == later + timedelta(seconds=1)
    # A cron schedule's occurrences are only counted by a walk: the rest is a lower bound.
    cron = settle(
        attempt(), CallOutcome(status_code=200), job(overlap="skip", cron="* * * * * *"), later, zero
    )
    assert len(cron.skipped) == SKIPPED_CAP and cron.unrecorded_skips >= 1
    assert cron.job["next_run_at"] > later  # its jittered instant is still ahead


def test_buffer_one_moves_on_from_the_runs_occurrence_as_before():
    later = NOMINAL + timedelta(minutes=4, seconds=10)
    done = settle(attempt(), CallOutcome(status_code=200), job(overlap="buffer_one", jitter_s=0), later, zero)
    assert done.skipped == () and done.job["nominal_at"] == NOMINAL + timedelta(minutes=1)


def test_an_allow_jobs_run_is_retried_as_a_run_of_its_own():
    own = Attempt(uuid.UUID(int=5), "schedule", NOMINAL, 1, RETRY, own_lease=True)
    failed = settle(own, CallOutcome(status_code=503), None, NOW, zero)
    assert (failed.run_state, failed.job, failed.retry_at) == ("failed", None, NOW + timedelta(seconds=5))
    done = settle(own, CallOutcome(status_code=200), None, NOW, zero)
    assert (done.run_state, done.job, done.retry_at) == ("succeeded", None, None)


def test_settling_reads_only_the_job_columns_the_completion_locks():
    # The completion reads JOB_COLUMNS alone from a locked job row (`job()` holds just
    # those): every rule, for every kind, must make do with them.
    assert set(job()) == set(JOB_COLUMNS)
    rows = (
        job(),
        job(schedule_kind="interval", cron=None, interval_s=60),
        job(schedule_kind="once", cron=None, run_at=NOMINAL),
        job(skipped_after=NOMINAL, skipped_through=NOMINAL + timedelta(minutes=5)),
    )
    outcomes = (CallOutcome(status_code=200), CallOutcome(status_code=503), CallOutcome(error="timeout"))
    for row in rows:
        for outcome in outcomes:
            for n in (1, 3):
                assert settle(attempt(n), outcome, row, NOW, zero).job is not None
