"""Declarative jobs: PUT /jobs/by-key/{key} creates or replaces, and `punctual apply FILE`
makes the owner's keyed jobs match a file; an edited schedule never fires at once."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from click.testing import CliRunner

from app.cli import main
from app.core.retries import CallOutcome
from app.core.timefmt import format_instant, parse_instant, utcnow
from app.lifecycle.completion import Finished, complete
from app.lifecycle.message import DispatchRun
from app.registry.engines import registry_for
from app.services.job_keys import job_id_for_key
from tests.integration.api_fixtures import WEBHOOK, insert_run, job_body, job_row, set_job

pytestmark = pytest.mark.integration


def put(caller, key: str, body: dict, query: str = ""):
    return caller.client.put(f"/jobs/by-key/{key}{query}", json=body, headers=caller._headers(None))


def test_put_creates_then_leaves_an_equal_job_alone_then_replaces_it_whole(alice):
    body = job_body(retry={"max_attempts": 3}, labels={"team": "billing"}, jitter_s=5)
    created = put(alice, "nightly-billing", body)
    assert created.status_code == 201 and created.headers["Punctual-Change"] == "created"
    job = created.get_json()
    assert job["key"] == "nightly-billing" and job["id"] == str(
        job_id_for_key(alice.owner, "nightly-billing")
    )
    assert created.headers["Location"] == f"/jobs/{job['id']}"
    assert alice.get("/jobs/by-key/nightly-billing").get_json() == job

    again = put(alice, "nightly-billing", {**body, "key": "nightly-billing", "retry": {"max_attempts": 3.0}})
    assert again.status_code == 200 and again.headers["Punctual-Change"] == "unchanged"
    assert again.get_json() == job  # not even updated_at moved

    replaced = put(alice, "nightly-billing", job_body(name="renamed"))
    assert replaced.status_code == 200 and replaced.headers["Punctual-Change"] == "updated"
    new = replaced.get_json()
    assert (new["id"], new["name"], new["labels"], new["jitter_s"]) == (job["id"], "renamed", {}, 0)
    assert new["retry"]["max_attempts"] == 5  # omitted fields take their defaults: a whole replacement


def test_a_key_names_one_job_per_owner(alice, bob):
    mine = put(alice, "report", job_body()).get_json()
    theirs = put(bob, "report", job_body()).get_json()
    assert mine["id"] != theirs["id"]
    assert bob.get(f"/jobs/{mine['id']}").status_code == 404
    assert alice.get("/jobs/by-key/nobody").status_code == 404
    assert alice.get("/jobs/by-key/..").status_code == 404


def test_a_dry_run_answers_what_would_happen_and_writes_nothing(alice):
    planned = put(alice, "dry", job_body(), "?dry_run=true")
    assert planned.status_code == 200 and planned.headers["Punctual-Change"] == "created"
    assert planned.get_json()["key"] == "dry" and "Location" not in planned.headers
    assert alice.get("/jobs/by-key/dry").status_code == 404

    job = put(alice, "dry", job_body()).get_json()
    planned = put(alice, "dry", job_body(schedule={"cron": "30 1 * * *"}), "?dry_run=true")
    assert planned.headers["Punctual-Change"] == "updated"
    assert planned.get_json()["schedule"]["cron"] == "30 1 * * *"
    assert alice.get("/jobs/by-key/dry").get_json() == job


def test_a_bad_key_and_bad_fields_are_one_422_listing_them_all(alice):
    response = put(alice, "-bad", {"name": "", "target": WEBHOOK, "schedule": {"cron": "nope"}})
    assert response.status_code == 422
    assert [e["field"] for e in response.get_json()["errors"]] == ["key", "name", "schedule.cron"]
    mismatch = put(alice, "good", {**job_body(), "key": "other"})
    assert [e["field"] for e in mismatch.get_json()["errors"]] == ["key"]
    assert alice.get("/jobs/by-key/good").status_code == 404
    posted = alice.post("/jobs", json={**job_body(), "key": "x"})
    assert posted.status_code == 422
    assert posted.get_json()["errors"] == [
        {"field": "key", "message": "unknown field: a job's key is set by PUT /jobs/by-key/{key}"}
    ]
    assert put(alice, "bad-flag", job_body(), "?dry_run=maybe").status_code == 422


def test_put_revives_a_cancelled_job_and_leaves_a_finished_one_off_it_does_not_change(alice, api_settings):
    job = put(alice, "revived", job_body()).get_json()
    alice.delete(f"/jobs/{job['id']}")
    revived = put(alice, "revived", job_body())
    assert revived.headers["Punctual-Change"] == "updated"
    assert revived.get_json()["state"] == "scheduled" and revived.get_json()["next_run_at"] is not None

    soon = {"run_at": format_instant(utcnow() + timedelta(hours=1))}
    once = put(alice, "once", job_body(schedule=soon)).get_json()
    set_job(api_settings, once["id"], state="completed", next_run_at=None)
    assert put(alice, "once", job_body(schedule=soon)).headers["Punctual-Change"] == "unchanged"
    later = {"run_at": format_instant(utcnow() + timedelta(hours=2))}
    again = put(alice, "once", job_body(schedule=later)).get_json()
    assert again["state"] == "scheduled" and again["next_run_at"] == later["run_at"]


def test_keyed_jobs_are_listed_apart(alice):
    keyed = put(alice, "listed", job_body()).get_json()
    plain = alice.create()
    assert [j["id"] for j in alice.get("/jobs?keyed=true").get_json()["items"]] == [keyed["id"]]
    assert [j["id"] for j in alice.get("/jobs?keyed=false").get_json()["items"]] == [plain["id"]]
    assert plain["key"] is None


def test_a_schedule_edited_while_a_run_is_in_flight_never_fires_the_job_at_once(alice, api_settings):
    """The run in flight moves the job on from its own instant with the new schedule;
    an occurrence of the new schedule between that instant and the edit is not due."""
    job = put(alice, "edited", job_body(schedule={"cron": "0 0 * * *", "timezone": "UTC"})).get_json()
    started = utcnow() - timedelta(minutes=5)  # a long call: five minutes in flight
    token = uuid.uuid4()
    set_job(
        api_settings, job["id"], state="running", lease_token=token, leased_until=utcnow() + timedelta(60)
    )
    run = insert_run(
        api_settings, job, state="running", lease_token=token, scheduled_for=started, finished_at=None
    )

    edited_at = utcnow()
    put(alice, "edited", job_body(schedule={"cron": "* * * * *", "timezone": "UTC"}))
    message = DispatchRun.from_row({**run, "retry": {}}, None, recurring=True)
    complete(
        registry_for(api_settings), [Finished(message, CallOutcome(status_code=200), utcnow())], utcnow()
    )

    after = alice.get(f"/jobs/{job['id']}").get_json()
    assert after["state"] == "scheduled"
    assert parse_instant(after["next_run_at"]) > edited_at  # not 4 minutes ago: it would fire at once
    assert job_row(api_settings, job["id"])["rescheduled_at"] >= edited_at


@pytest.fixture
def punctual(live_server, alice):
    runner = CliRunner()
    env = {"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": alice.api_key}

    def run(*args: str, code: int = 0):
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result

    return run


TWO_JOBS = """
jobs:
  - key: nightly-report
    name: nightly report
    target: {type: webhook, url: "http://127.0.0.1:9/report"}
    schedule: {cron: "0 2 * * *", timezone: Europe/Berlin, start_at: 2026-01-01T00:00:00Z}
    labels: {team: reports}
  - key: hourly-sync
    name: hourly sync
    target: {type: webhook, url: "http://127.0.0.1:9/sync"}
    schedule: {interval_s: 3600}
"""


def test_apply_creates_updates_and_prunes_to_match_the_file(punctual, alice, tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(TWO_JOBS)
    first = punctual("apply", str(path))
    assert first.stdout.splitlines() == ["create   nightly-report", "create   hourly-sync"]
    report = alice.get("/jobs/by-key/nightly-report").get_json()
    assert report["schedule"]["start_at"] == "2026-01-01T00:00:00Z" and report["labels"] == {
        "team": "reports"
    }

    assert punctual("apply", str(path)).stdout.splitlines() == [
        "same     nightly-report",
        "same     hourly-sync",
    ]

    changed = TWO_JOBS.split("  - key: hourly-sync")[0].replace('"0 2 * * *"', '"30 2 * * *"')
    path.write_text(changed)
    plan = punctual("apply", str(path), "--prune", "--dry-run")
    assert plan.stdout.splitlines() == ["update   nightly-report  (schedule)", "cancel   hourly-sync"]
    assert "nothing was changed" in plan.stderr
    assert alice.get("/jobs/by-key/nightly-report").get_json() == report
    assert alice.get("/jobs/by-key/hourly-sync").get_json()["state"] == "scheduled"

    kept = punctual("apply", str(path))
    assert "1 keyed jobs not in the file left alone" in kept.stderr
    assert alice.get("/jobs/by-key/nightly-report").get_json()["schedule"]["cron"] == "30 2 * * *"
    punctual("apply", str(path), "--prune")
    assert alice.get("/jobs/by-key/hourly-sync").get_json()["state"] == "cancelled"


def test_apply_reads_json_and_changes_nothing_when_an_entry_is_invalid(punctual, alice, tmp_path):
    path = tmp_path / "jobs.json"
    good = {"key": "good", **job_body()}
    bad = {"key": "bad", **job_body(schedule={"cron": "61 * * * *"})}
    path.write_text(json.dumps({"jobs": [good, bad]}))
    result = punctual("apply", str(path), "--json", code=1)
    [line] = [json.loads(text) for text in result.stdout.splitlines()]
    assert (line["key"], line["change"]) == ("bad", "invalid")
    assert [e["field"] for e in line["problem"]["errors"]] == ["schedule.cron"]
    assert "nothing was changed" in result.stderr
    assert "schedule.cron" in punctual("apply", str(path), code=1).stderr
    assert alice.get("/jobs/by-key/good").status_code == 404

    path.write_text(json.dumps([good]))
    [line] = [json.loads(text) for text in punctual("apply", str(path), "--json").stdout.splitlines()]
    assert (line["key"], line["change"], line["job"]["key"]) == ("good", "created", "good")


@pytest.mark.parametrize(
    "text, says",
    [
        ("jobs: [{name: x}]", "has no `key`"),
        ("jobs: [{key: a}, {key: a}]", "given twice"),
        ("other: []", "unknown top-level field"),
        ("jobs: [oops", "not YAML or JSON"),
    ],
)
def test_apply_refuses_a_bad_file_before_sending_anything(punctual, tmp_path, text, says):
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    assert says in punctual("apply", str(path), code=2).output
