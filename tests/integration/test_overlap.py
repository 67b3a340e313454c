"""The overlap policies on real Postgres: an `allow` job's runs hold leases of their own
and go side by side; a `skip` job records what fell due while its run was in flight;
`buffer_one` is what a job always did."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.overlap import IN_FLIGHT
from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.pollers import janitor
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.registry.schema import runs
from app.services.jobs import pause_job, resume_job
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration

OK = CallOutcome(status_code=200)


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def every_second(overlap: str, behind_s: float = 0.5, **extra) -> dict:
    first = utcnow().replace(microsecond=0) - timedelta(seconds=behind_s)
    return {**job_row(16, interval_s=1, start_at=first, first=first, **extra), "overlap": overlap}


def claim(registry, row, at=None):
    """Claim `row`'s shard as at `at` (default: the row's first instant, so a slow box
    does not make its first occurrence late)."""
    shard = row["shard"]
    at = at or row["next_run_at"]
    return claim_batch(registry.engine_for_shard(shard), shard, at, registry.settings).runs


def test_an_allow_jobs_runs_hold_their_own_leases_and_go_side_by_side(registry):
    row = every_second("allow")
    insert_jobs(registry, [row])
    [first] = claim(registry, row)
    assert first.own_lease and first.leased_on_run and first.origin == "schedule"
    after = job(registry, row["job_id"])
    assert (after["state"], after["lease_token"]) == ("scheduled", None)
    assert after["nominal_at"] == first.scheduled_for + timedelta(seconds=1)  # moved past it at once
    [stored] = runs_of(registry, row["job_id"])
    assert stored["lease_token"] == first.lease_token and stored["leased_until"] > utcnow()

    assert lease.start(registry, [first], utcnow()) == {first.run_id}
    # The next occurrence is claimed while the first is in flight, with a lease of its own.
    [second] = claim(registry, row, at=first.scheduled_for + timedelta(seconds=1))
    assert second.scheduled_for == first.scheduled_for + timedelta(seconds=1) and second.own_lease
    assert lease.start(registry, [second], utcnow()) == {second.run_id}
    assert lease.heartbeat(registry, [first, second], utcnow()) == {first.run_id, second.run_id}

    report = complete(
        registry,
        [Finished(first, OK, utcnow()), Finished(second, CallOutcome(status_code=503), utcnow())],
        utcnow(),
        rand=lambda: 0.0,
    )
    assert report.applied == 2
    history = {(r["scheduled_for"], r["attempt"]): r for r in runs_of(registry, row["job_id"])}
    assert history[(first.scheduled_for, 1)]["state"] == "succeeded"
    assert history[(second.scheduled_for, 1)]["state"] == "failed"
    retry = history[(second.scheduled_for, 2)]  # its own next attempt; the job never waited for it
    assert (retry["state"], retry["origin"], retry["published"]) == ("claimed", "schedule", False)
    assert retry["leased_until"] is not None
    assert job(registry, row["job_id"])["nominal_at"] == second.scheduled_for + timedelta(seconds=1)


def test_the_janitor_takes_back_an_allow_run_whose_lease_ran_out(registry):
    row = every_second("allow")
    insert_jobs(registry, [row])
    [run] = claim(registry, row)
    lease.start(registry, [run], utcnow())
    with registry.engine_for_shard(run.shard).begin() as conn:
        conn.execute(
            sa.update(runs)
            .where(runs.c.run_id == run.run_id)
            .values(leased_until=utcnow() - timedelta(seconds=1))
        )
    assert janitor.expire(registry.engine_for_shard(run.shard), run.shard, utcnow(), registry.settings) == 1
    states = sorted((r["attempt"], r["state"]) for r in runs_of(registry, row["job_id"]))
    assert states == [(1, "failed"), (2, "claimed")]


def test_pausing_an_allow_job_takes_back_its_claimed_run_and_rewinds_the_cursor(registry):
    row = every_second("allow", behind_s=-3)  # three seconds ahead: claimed ahead
    insert_jobs(registry, [row])
    [run] = claim(registry, row)
    assert job(registry, row["job_id"])["nominal_at"] == run.scheduled_for + timedelta(seconds=1)

    paused = pause_job(registry, "tests", str(row["job_id"]), utcnow())

    assert paused["state"] == "paused" and paused["nominal_at"] == run.scheduled_for
    assert runs_of(registry, row["job_id"]) == []
    assert resume_job(registry, "tests", str(row["job_id"]), utcnow())["state"] == "scheduled"
    [again] = claim(registry, row)
    assert again.scheduled_for == run.scheduled_for and again.lease_token != run.lease_token


def test_a_skip_job_records_what_fell_due_while_its_run_was_in_flight(registry):
    row = every_second("skip")
    insert_jobs(registry, [row])
    [run] = claim(registry, row)
    assert not run.own_lease and job(registry, row["job_id"])["state"] == "running"
    lease.start(registry, [run], utcnow())
    ended = run.scheduled_for + timedelta(seconds=4, milliseconds=500)  # four occurrences fell due

    complete(registry, [Finished(run, OK, ended)], ended)

    after = job(registry, row["job_id"])
    assert after["state"] == "scheduled" and after["nominal_at"] == run.scheduled_for + timedelta(seconds=5)
    skipped = [r for r in runs_of(registry, row["job_id"]) if r["state"] == "skipped"]
    assert [r["scheduled_for"] for r in skipped] == [
        run.scheduled_for + timedelta(seconds=s) for s in (1, 2, 3, 4)
    ]
    assert {r["error"] for r in skipped} == {IN_FLIGHT}


def test_buffer_one_waits_for_the_run_and_leaves_the_backlog_to_the_misfire_policy(registry):
    row = every_second("buffer_one")
    insert_jobs(registry, [row])
    [run] = claim(registry, row)
    lease.start(registry, [run], utcnow())
    ended = run.scheduled_for + timedelta(seconds=4, milliseconds=500)
    complete(registry, [Finished(run, OK, ended)], ended)
    after = job(registry, row["job_id"])
    assert after["nominal_at"] == run.scheduled_for + timedelta(seconds=1)  # due: buffered
    [latest] = claim(registry, row, at=ended)
    assert latest.scheduled_for == run.scheduled_for + timedelta(seconds=4)  # run_once: the latest runs
    superseded = [r for r in runs_of(registry, row["job_id"]) if r["state"] == "skipped"]
    assert len(superseded) == 3 and all("superseded" in r["error"] for r in superseded)
