"""Run history, dead letters and replay against real Postgres (two physical shards)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, parse_instant, utcnow
from tests.integration.api_fixtures import insert_run, job_row, run_rows, set_job

pytestmark = pytest.mark.integration


def test_history_is_newest_first_with_every_field(alice, api_settings):
    job = alice.create()
    now = utcnow()
    first = insert_run(
        api_settings,
        job,
        state="failed",
        attempt=1,
        created_at=now - timedelta(seconds=20),
        status_code=503,
        error="HTTP 503",
    )
    second = insert_run(
        api_settings,
        job,
        state="succeeded",
        attempt=2,
        created_at=now - timedelta(seconds=10),
        status_code=200,
        error=None,
    )
    response = alice.get(f"/jobs/{job['id']}/runs")
    assert response.status_code == 200
    page = response.get_json()
    assert [r["id"] for r in page["items"]] == [str(second["run_id"]), str(first["run_id"])]
    assert page["next_cursor"] is None
    run = page["items"][0]
    assert run == {
        "id": str(second["run_id"]),
        "job_id": job["id"],
        "origin": "schedule",
        "scheduled_for": format_instant(second["scheduled_for"]),
        "attempt": 2,
        "state": "succeeded",
        "started_at": format_instant(second["started_at"]),
        "finished_at": format_instant(second["finished_at"]),
        "lateness_ms": 12,
        "status_code": 200,
        "error": None,
    }


def test_history_pages_with_a_cursor(alice, api_settings):
    job = alice.create()
    now = utcnow()
    ids = [
        str(
            insert_run(api_settings, job, state="succeeded", created_at=now + timedelta(milliseconds=i))[
                "run_id"
            ]
        )
        for i in range(5)
    ]
    seen, cursor = [], None
    while True:
        page = alice.get(
            f"/jobs/{job['id']}/runs", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})}
        ).get_json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]


@pytest.mark.parametrize(
    "query, field", [({"limit": 0}, "limit"), ({"limit": 501}, "limit"), ({"cursor": "nope"}, "cursor")]
)
def test_history_bad_parameters_are_422(alice, query, field):
    job = alice.create()
    response = alice.get(f"/jobs/{job['id']}/runs", query_string=query)
    assert response.status_code == 422 and response.get_json()["errors"][0]["field"] == field


def test_history_of_an_unknown_job_is_404(alice):
    assert alice.get(f"/jobs/{uuid.uuid4()}/runs").status_code == 404


def test_dead_letters_list_the_owners_dead_runs_across_shards(alice, bob, api_settings):
    jobs = [alice.create(name=f"dl-{i}") for i in range(6)]
    dead = [
        insert_run(api_settings, j, created_at=utcnow() + timedelta(milliseconds=i))
        for i, j in enumerate(jobs)
    ]
    insert_run(api_settings, jobs[0], state="failed")  # not dead: not listed
    bob_job = bob.create()
    insert_run(api_settings, bob_job)
    page = alice.get("/dead-letters", query_string={"limit": 4}).get_json()
    rest = alice.get("/dead-letters", query_string={"cursor": page["next_cursor"]}).get_json()
    listed = [r["id"] for r in page["items"] + rest["items"]]
    assert listed == [str(d["run_id"]) for d in dead][::-1]
    assert rest["next_cursor"] is None
    assert all(r["state"] == "dead" for r in page["items"])
    # Each dead letter names its job: a run's fields, plus the job's name beside its id.
    names = {j["id"]: j["name"] for j in jobs}
    assert all(r["job_name"] == names[r["job_id"]] for r in page["items"] + rest["items"])
    assert set(page["items"][0]) == set(alice.get(f"/jobs/{jobs[0]['id']}/runs").get_json()["items"][0]) | {
        "job_name"
    }


def test_dead_letters_bad_cursor_is_422(alice):
    response = alice.get("/dead-letters", query_string={"cursor": "Zm9vLmJhcg"})
    assert response.status_code == 422 and response.get_json()["errors"][0]["field"] == "cursor"


def test_replay_of_a_recurring_jobs_dead_run_fires_a_new_run_with_the_same_key(alice, api_settings):
    job = alice.create(schedule={"interval_s": 60})
    dead = insert_run(api_settings, job)
    response = alice.post(f"/runs/{dead['run_id']}/replay")
    assert response.status_code == 202
    assert response.get_json()["state"] == "replayed" and response.get_json()["id"] == str(dead["run_id"])
    rows = {r["run_id"]: r for r in run_rows(api_settings, job["id"])}
    assert rows[dead["run_id"]]["state"] == "replayed"
    [new] = [r for r in rows.values() if r["run_id"] != dead["run_id"]]
    assert (new["origin"], new["state"], new["attempt"], new["published"]) == ("replay", "claimed", 1, False)
    assert new["scheduled_for"] == dead["scheduled_for"]  # the same idempotency key
    assert new["lease_token"] is not None and new["due_at"] <= utcnow()
    assert alice.get("/dead-letters").get_json()["items"] == []
    after = alice.get(f"/jobs/{job['id']}").get_json()
    assert after["next_run_at"] == job["next_run_at"]


def test_replay_of_a_dead_one_off_puts_the_job_back_to_scheduled(alice, api_settings):
    job = alice.create(schedule={"run_at": "2030-01-01T00:00:00Z"})
    set_job(api_settings, job["id"], state="dead", next_run_at=None, attempt=5)
    dead = insert_run(api_settings, job, scheduled_for=parse_instant("2030-01-01T00:00:00Z"))
    before = utcnow()
    assert alice.post(f"/runs/{dead['run_id']}/replay").status_code == 202
    row = job_row(api_settings, job["id"])
    assert (row["state"], row["attempt"], row["misfire_exempt"]) == ("scheduled", 0, True)
    assert row["nominal_at"] == parse_instant("2030-01-01T00:00:00Z")
    assert before <= row["next_run_at"] <= utcnow()
    assert [r["state"] for r in run_rows(api_settings, job["id"])] == [
        "replayed"
    ]  # the poller claims it as usual


@pytest.mark.parametrize("state", ["failed", "succeeded", "replayed", "claimed"])
def test_replay_of_a_run_that_is_not_dead_is_409(alice, api_settings, state):
    job = alice.create()
    run = insert_run(api_settings, job, state=state)
    assert alice.post(f"/runs/{run['run_id']}/replay").status_code == 409


def test_replay_twice_is_409_the_second_time(alice, api_settings):
    job = alice.create()
    dead = insert_run(api_settings, job)
    assert alice.post(f"/runs/{dead['run_id']}/replay").status_code == 202
    assert alice.post(f"/runs/{dead['run_id']}/replay").status_code == 409


def test_replay_for_a_cancelled_job_is_409(alice, api_settings):
    job = alice.create()
    dead = insert_run(api_settings, job)
    alice.delete(f"/jobs/{job['id']}")
    assert alice.post(f"/runs/{dead['run_id']}/replay").status_code == 409


@pytest.mark.parametrize("run_id", [lambda: str(uuid.uuid4()), lambda: "nope"])
def test_replay_of_an_unknown_run_is_404(alice, run_id):
    assert alice.post(f"/runs/{run_id()}/replay").status_code == 404
