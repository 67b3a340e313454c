"""The claim plan: misfire policies applied to one due job row (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.pollers import plan
from app.pollers.plan import plan_claim

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def row(policy="run_once", behind_s=3, interval_s=1, **overrides) -> dict:
    """A job on a 1 s grid whose cursor is `behind_s` seconds behind NOW."""
    first = NOW - timedelta(seconds=behind_s)
    job = {
        "job_id": uuid.UUID(int=7),
        "schedule_kind": "interval",
        "run_at": None,
        "cron": None,
        "interval_s": interval_s,
        "timezone": "UTC",
        "start_at": first,
        "end_at": None,
        "dst_gap": "shift",
        "dst_overlap": "once",
        "misfire": policy,
        "jitter_s": 0,
        "nominal_at": first,
        "next_run_at": first,
        "attempt": 0,
        "misfire_exempt": False,
        "skipped_after": None,
        "skipped_through": None,
        "created_at": first,
    }
    job.update(overrides)
    return job


def test_on_time_runs_its_occurrence():
    plan = plan_claim(row(behind_s=0), NOW, grace_s=1)
    assert plan.run.nominal == NOW and plan.attempt == 1 and plan.skipped == ()


@pytest.mark.parametrize("policy", ["run_once", "run_all", "skip"])
def test_less_than_the_grace_late_runs_late_under_every_policy(policy):
    plan = plan_claim(row(policy, behind_s=0.5, interval_s=60), NOW, grace_s=1)
    assert plan.run.nominal == NOW - timedelta(seconds=0.5) and plan.skipped == ()


def test_run_once_runs_the_latest_and_skips_the_rest():
    plan = plan_claim(row("run_once", behind_s=4), NOW, grace_s=1)
    assert plan.run.nominal == NOW and plan.attempt == 1
    assert [o.nominal for o in plan.skipped] == [NOW - timedelta(seconds=s) for s in (4, 3, 2, 1)]


def test_run_all_runs_the_oldest_and_skips_none():
    plan = plan_claim(row("run_all", behind_s=4), NOW, grace_s=1)
    assert (
        plan.run.nominal == NOW - timedelta(seconds=4) and plan.skipped == () and plan.skipped_range is None
    )


def test_skip_with_everything_late_runs_nothing_and_moves_on():
    plan = plan_claim(row("skip", behind_s=30, interval_s=10), NOW + timedelta(seconds=5), grace_s=1)
    assert plan.run is None and len(plan.skipped) == 4
    assert plan.moved_to.nominal == NOW + timedelta(seconds=10)


def test_run_all_over_the_cap_remembers_a_skipped_range():
    plan = plan_claim(row("run_all", behind_s=1500), NOW, grace_s=1)
    first = NOW - timedelta(seconds=1500)
    assert plan.run.nominal == first
    assert plan.skipped_range == (first + timedelta(seconds=999), NOW)
    assert plan.skipped and all(o.nominal > plan.skipped_range[0] for o in plan.skipped)


def test_run_all_within_its_catch_up_runs_the_current_occurrence():
    first = NOW - timedelta(seconds=1500)
    job = row("run_all", behind_s=1400, skipped_after=first + timedelta(seconds=999), skipped_through=NOW)
    plan = plan_claim(job, NOW, grace_s=1)
    assert plan.run.nominal == NOW - timedelta(seconds=1400) and plan.skipped == ()


def test_retries_and_held_runs_are_never_misfires():
    plan = plan_claim(row("skip", behind_s=600, misfire_exempt=True, attempt=2), NOW, grace_s=1)
    assert plan.run.nominal == NOW - timedelta(seconds=600) and plan.attempt == 3 and plan.skipped == ()


def test_a_late_one_off_still_runs():
    late = NOW - timedelta(hours=2)
    plan = plan_claim(
        row("skip", schedule_kind="once", run_at=late, nominal_at=late, next_run_at=late), NOW, 1
    )
    assert plan.run.nominal == late


@pytest.mark.parametrize("policy", ["run_once", "run_all", "skip"])
def test_a_job_claimed_ahead_is_on_time_under_every_policy(policy):
    # Its cursor is 5 s in the future: planned as at its instant, never a misfire,
    # even with no grace at all.
    plan = plan_claim(row(policy, behind_s=-5, interval_s=60), NOW, grace_s=0)
    assert plan.run.nominal == NOW + timedelta(seconds=5) and plan.attempt == 1
    assert plan.skipped == () and plan.unrecorded_skips == 0 and plan.skipped_range is None


# --- overlap `allow`: the run holds its own lease, the cursor moves on at once --------


def test_an_allow_job_moves_past_its_run_at_the_claim():
    plan = plan_claim(row(behind_s=0, overlap="allow"), NOW, grace_s=1)
    assert plan.own_lease and plan.run.nominal == NOW and plan.attempt == 1
    assert plan.moved_to.nominal == NOW + timedelta(seconds=1)


def test_an_allow_job_behind_runs_its_misfire_plan_then_moves_past_it():
    once = plan_claim(row("run_once", behind_s=3, overlap="allow"), NOW, grace_s=1)
    assert once.own_lease and once.run.nominal == NOW and len(once.skipped) == 3
    assert once.moved_to.nominal == NOW + timedelta(seconds=1)
    every = plan_claim(row("run_all", behind_s=3, overlap="allow"), NOW, grace_s=1)
    assert every.run.nominal == NOW - timedelta(seconds=3)
    assert every.moved_to.nominal == NOW - timedelta(seconds=2)  # due: the next claim takes it


def test_an_allow_job_with_no_occurrence_left_is_over_at_the_claim():
    plan = plan_claim(row(behind_s=0, overlap="allow", end_at=NOW), NOW, grace_s=1)
    assert plan.own_lease and plan.run.nominal == NOW and plan.moved_to is None


@pytest.mark.parametrize("overlap", ["buffer_one", "skip"])
def test_the_other_policies_claim_with_the_jobs_lease(overlap):
    plan = plan_claim(row(behind_s=0, overlap=overlap), NOW, grace_s=1)
    assert not plan.own_lease and plan.moved_to is None


def test_a_one_off_is_claimed_with_the_jobs_lease_whatever_its_overlap():
    once = row(behind_s=0, overlap="allow", schedule_kind="once", run_at=NOW, interval_s=None)
    assert not plan_claim(once, NOW, grace_s=1).own_lease


# The on-time shortcut (`_on_time`) gives the plan the backlog search gives, for any
# row: cron and interval, every policy, jitter, behind or on time, a run_all range.
@st.composite
def rows(draw):
    behind_s = draw(st.sampled_from([0, 0.5, 1, 3, 59, 61, 3600, 86_400 + 1]))
    cron = draw(st.sampled_from([None, "* * * * *", "0 0 * * *", "*/20 * * * * *", "30 2 * * *"]))
    job = row(
        draw(st.sampled_from(["run_once", "run_all", "skip"])),
        behind_s=behind_s,
        interval_s=draw(st.sampled_from([1, 60, 3600])),
        jitter_s=draw(st.sampled_from([0, 0, 5, 90])),
        attempt=draw(st.sampled_from([0, 2])),
        overlap=draw(st.sampled_from(["buffer_one", "allow"])),
    )
    if cron is not None:
        job.update(
            schedule_kind="cron",
            cron=cron,
            interval_s=None,
            timezone=draw(st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"])),
            start_at=None,
        )
    if draw(st.booleans()):
        job.update(skipped_after=job["nominal_at"] - timedelta(hours=1), skipped_through=job["nominal_at"])
    return job


@settings(max_examples=300, deadline=None)
@given(rows(), st.sampled_from([1, 60]))
def test_the_on_time_shortcut_plans_as_the_backlog_search(job, grace_s):
    shortcut = plan_claim(job, NOW, grace_s)
    with patch.object(plan, "_on_time", lambda *args: False):
        assert plan_claim(job, NOW, grace_s) == shortcut
