"""POST /jobs/{id}/backfill: one off-schedule `backfill` run per occurrence of a past
range, written in bulk, with the contract's bounds and errors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, parse_instant, utcnow
from punctual_client import Client
from tests.integration.api_fixtures import run_rows

pytestmark = pytest.mark.integration


def backfill(caller, job_id: str, start, end):
    body = {"start": format_instant(start), "end": format_instant(end)}
    return caller.post(f"/jobs/{job_id}/backfill", json=body)


def test_every_occurrence_of_the_range_becomes_a_claimed_backfill_run_of_its_own(alice, api_settings):
    job = alice.create(schedule={"cron": "0 * * * *", "timezone": "Asia/Kolkata"})  # at :30 UTC
    end = utcnow().replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=5)
    response = backfill(alice, job["id"], start, end)
    assert response.status_code == 202
    answer = response.get_json()
    expected = [start + timedelta(minutes=30) + timedelta(hours=h) for h in range(5)]
    assert answer == {
        "job_id": job["id"],
        "count": 5,
        "first": format_instant(expected[0]),
        "last": format_instant(expected[-1]),
    }
    rows = sorted(run_rows(api_settings, job["id"]), key=lambda row: row["due_at"])
    assert [row["scheduled_for"] for row in rows] == expected  # oldest published first
    assert {(row["origin"], row["state"], row["attempt"], row["published"]) for row in rows} == {
        ("backfill", "claimed", 1, False)
    }
    assert len({row["lease_token"] for row in rows}) == 5
    assert all(row["leased_until"] > utcnow() + timedelta(seconds=60) for row in rows)

    listed = alice.get(f"/jobs/{job['id']}/runs?origin=backfill").get_json()["items"]
    assert [run["origin"] for run in listed] == ["backfill"] * 5
    assert alice.get(f"/jobs/{job['id']}/runs?origin=schedule").get_json()["items"] == []
    after = alice.get(f"/jobs/{job['id']}").get_json()
    assert (after["state"], after["next_run_at"]) == (job["state"], job["next_run_at"])  # the cursor stays


def test_an_interval_without_start_at_is_backfilled_on_its_grid_before_the_job_existed(alice, api_settings):
    job = alice.create(schedule={"interval_s": 600})
    created = parse_instant(job["created_at"])
    answer = backfill(alice, job["id"], created - timedelta(minutes=25), created).get_json()
    grid = [created - timedelta(minutes=20), created - timedelta(minutes=10)]  # the creation is no occurrence
    assert (answer["count"], answer["first"], answer["last"]) == (2, *map(format_instant, grid))


def test_a_range_with_no_occurrence_backfills_nothing(alice):
    job = alice.create(schedule={"cron": "0 0 1 1 *"})
    end = utcnow()
    answer = backfill(alice, job["id"], end - timedelta(hours=1), end).get_json()
    assert answer == {"job_id": job["id"], "count": 0, "first": None, "last": None}


@pytest.mark.parametrize(
    "body, fields",
    [
        ({}, ["start", "end"]),
        ({"start": "yesterday", "end": "2026-01-01T00:00:00", "why": 1}, ["why", "start", "end"]),
        ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, ["start"]),
        ({"start": "2026-01-01T00:00:00Z", "end": "9999-01-01T00:00:00Z"}, ["end"]),
        ([], ["body"]),
    ],
)
def test_a_bad_range_is_422_listing_every_bad_field(alice, api_settings, body, fields):
    job = alice.create()
    response = alice.post(f"/jobs/{job['id']}/backfill", json=body)
    assert response.status_code == 422
    assert [e["field"] for e in response.get_json()["errors"]] == fields
    assert run_rows(api_settings, job["id"]) == []


def test_more_than_ten_thousand_occurrences_is_422_naming_how_many(alice, api_settings):
    every_second = alice.create(schedule={"cron": "* * * * * *"})
    end = utcnow()
    response = backfill(alice, every_second["id"], end - timedelta(hours=3), end)
    assert response.status_code == 422
    [error] = response.get_json()["errors"]
    assert error["field"] == "end" and "more than 10,000 occurrences (about 10,8" in error["message"]
    interval = alice.create(schedule={"interval_s": 1, "start_at": format_instant(end - timedelta(days=1))})
    response = backfill(alice, interval["id"], end - timedelta(hours=3), end - timedelta(seconds=1))
    assert (
        "holds 10,800 occurrences; a backfill takes at most 10,000"
        in response.get_json()["errors"][0]["message"]
    )
    assert run_rows(api_settings, every_second["id"]) == [] and run_rows(api_settings, interval["id"]) == []
    ten_thousand = backfill(
        alice, interval["id"], end - timedelta(seconds=10_000), end - timedelta(seconds=1)
    )
    assert ten_thousand.status_code == 202 and ten_thousand.get_json()["count"] == 10_000
    assert len(run_rows(api_settings, interval["id"])) == 10_000


def test_a_one_off_or_a_cancelled_job_is_409_and_another_owners_job_404(alice, bob):
    end = utcnow()
    once = alice.create(schedule={"run_at": format_instant(end + timedelta(hours=1))})
    assert backfill(alice, once["id"], end - timedelta(hours=1), end).status_code == 409
    cancelled = alice.create()
    alice.delete(f"/jobs/{cancelled['id']}")
    assert backfill(alice, cancelled["id"], end - timedelta(days=2), end).status_code == 409
    assert backfill(bob, alice.create()["id"], end - timedelta(days=2), end).status_code == 404


def test_cancel_fails_the_backfill_runs_not_started_yet(alice, api_settings):
    job = alice.create(schedule={"cron": "0 * * * *"})
    end = utcnow()
    assert backfill(alice, job["id"], end - timedelta(hours=3), end).get_json()["count"] == 3
    alice.delete(f"/jobs/{job['id']}")
    assert {(row["state"], row["error"]) for row in run_rows(api_settings, job["id"])} == {
        ("failed", "job cancelled")
    }


def test_the_sdk_backfills_and_lists_by_origin(live_server, alice):
    client = Client(live_server, alice.api_key)
    job = client.create_job("sdk", {"type": "webhook", "url": "http://127.0.0.1:9/"}, {"cron": "0 * * * *"})
    end = utcnow()
    done = client.backfill_job(job.id, end - timedelta(hours=2), end)
    assert done.count == 2 and done.first is not None and done.last is not None and done.first < done.last
    assert [run.origin for run in client.iter_runs(job.id, origin="backfill")] == ["backfill"] * 2
    assert alice.get(f"/jobs/{job.id}/runs?origin=bogus").status_code == 422
