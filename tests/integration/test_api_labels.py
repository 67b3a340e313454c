"""Labels on jobs: listed by selector, and the label verbs (pause, resume, cancel every
job a selector matches), through the API, the SDK and the CLI, on two Postgres shards."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner

from app.cli import main
from app.core.timefmt import format_instant, utcnow
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from punctual_client import Client, Selected
from tests.integration.api_fixtures import job_row, run_rows

pytestmark = pytest.mark.integration


def _labelled(caller, labels: dict, **overrides) -> dict:
    return caller.create(labels=labels, **overrides)


def _ids(page: dict) -> set[str]:
    return {item["id"] for item in page["items"]}


def test_labels_are_kept_shown_and_replaced_whole_by_patch(alice):
    job = _labelled(alice, {"team": "billing", "example.com/env": "prod"})
    assert job["labels"] == {"team": "billing", "example.com/env": "prod"}
    assert alice.get(f"/jobs/{job['id']}").get_json()["labels"] == job["labels"]
    patched = alice.patch(f"/jobs/{job['id']}", json={"labels": {"team": "ops"}}).get_json()
    assert patched["labels"] == {"team": "ops"}
    assert alice.patch(f"/jobs/{job['id']}", json={"labels": None}).get_json()["labels"] == {}
    assert alice.create()["labels"] == {}


def test_bad_labels_are_422_naming_every_bad_pair(alice):
    labels = {"ok": "fine", "-dash": "x", "team": "has space", "empty": "", "k" * 64: "v"}
    response = alice.post("/jobs", json={"name": "x", "labels": labels, "target": "nope", "schedule": {}})
    assert response.status_code == 422
    fields = {e["field"] for e in response.get_json()["errors"]}
    assert {"labels.-dash", "labels.team", "labels.empty", f"labels.{'k' * 64}"} <= fields
    assert "labels.ok" not in fields and "target" in fields
    too_many = {f"k{i}": "v" for i in range(17)}
    response = alice.post("/jobs", json={"name": "x", "labels": too_many})
    assert {"field": "labels", "message": "at most 16 labels"} in response.get_json()["errors"]
    assert alice.post("/jobs", json={"name": "x", "labels": ["a"]}).status_code == 422


def test_a_listing_by_label_needs_every_pair_and_sees_only_the_owners_jobs(alice, bob):
    both = _labelled(alice, {"team": "billing", "env": "prod"})
    billing = _labelled(alice, {"team": "billing", "env": "staging"})
    _labelled(alice, {"team": "ops", "env": "prod"})
    _labelled(bob, {"team": "billing", "env": "prod"})

    assert _ids(alice.get("/jobs?label=team:billing").get_json()) == {both["id"], billing["id"]}
    assert _ids(alice.get("/jobs?label=team:billing&label=env:prod").get_json()) == {both["id"]}
    assert _ids(alice.get("/jobs?label=team:billing&label=env:prod&label=").get_json()) == {both["id"]}
    assert _ids(alice.get("/jobs?label=team:nobody").get_json()) == set()
    page = alice.get("/jobs?label=team:billing&limit=1").get_json()
    rest = alice.get(f"/jobs?label=team:billing&limit=1&cursor={page['next_cursor']}").get_json()
    assert _ids(page) | _ids(rest) == {both["id"], billing["id"]} and rest["next_cursor"] is None


@pytest.mark.parametrize(
    "query",
    ["label=team", "label=:billing", "label=team:bill%20ing", "label=team:a&label=team:b"],
)
def test_a_bad_label_parameter_is_422_on_label(alice, query):
    response = alice.get(f"/jobs?{query}")
    assert response.status_code == 422
    assert [e["field"] for e in response.get_json()["errors"]] == ["label"]


def test_pause_resume_and_cancel_by_label_act_on_every_matching_job_of_the_owner_only(alice, bob):
    jobs = [_labelled(alice, {"team": "billing"}) for _ in range(5)]
    other = _labelled(alice, {"team": "ops"})
    bobs = _labelled(bob, {"team": "billing"})
    alice.post(f"/jobs/{jobs[0]['id']}/pause")

    answer = alice.post("/jobs/pause", json={"labels": {"team": "billing"}})
    assert answer.status_code == 200 and answer.get_json() == {"matched": 5, "changed": 4}
    assert {alice.get(f"/jobs/{j['id']}").get_json()["state"] for j in jobs} == {"paused"}
    assert alice.get(f"/jobs/{other['id']}").get_json()["state"] == "scheduled"
    assert bob.get(f"/jobs/{bobs['id']}").get_json()["state"] == "scheduled"

    assert alice.post("/jobs/resume", json={"labels": {"team": "billing"}}).get_json() == {
        "matched": 5,
        "changed": 5,
    }
    assert {alice.get(f"/jobs/{j['id']}").get_json()["state"] for j in jobs} == {"scheduled"}

    assert alice.post("/jobs/cancel", json={"labels": {"team": "billing"}}).get_json() == {
        "matched": 5,
        "changed": 5,
    }
    cancelled = [alice.get(f"/jobs/{j['id']}").get_json() for j in jobs]
    assert {(j["state"], j["next_run_at"]) for j in cancelled} == {("cancelled", None)}
    # A cancelled job is matched, and neither paused nor resumed again.
    assert alice.post("/jobs/resume", json={"labels": {"team": "billing"}}).get_json() == {
        "matched": 5,
        "changed": 0,
    }
    assert bob.get(f"/jobs/{bobs['id']}").get_json()["state"] == "scheduled"


def test_a_label_verb_takes_back_a_claimed_run_and_cancel_fails_one(alice, api_settings):
    registry = registry_for(api_settings)
    soon = format_instant(utcnow() + timedelta(seconds=3))
    paused, cancelled = (
        _labelled(alice, {"batch": name}, schedule={"run_at": soon}) for name in ("pause", "cancel")
    )
    for job in (paused, cancelled):
        shard = job_row(api_settings, job["id"])["shard"]
        claim_batch(registry.engine_for_shard(shard), shard, utcnow(), api_settings)
        assert job_row(api_settings, job["id"])["lease_token"] is not None  # claimed ahead

    assert alice.post("/jobs/pause", json={"labels": {"batch": "pause"}}).get_json()["changed"] == 1
    row = job_row(api_settings, paused["id"])
    assert (row["state"], row["lease_token"]) == ("paused", None)
    assert run_rows(api_settings, paused["id"]) == []  # taken back: never started, no attempt spent

    assert alice.post("/jobs/cancel", json={"labels": {"batch": "cancel"}}).get_json()["changed"] == 1
    [run] = run_rows(api_settings, cancelled["id"])
    assert (run["state"], run["error"], run["published"]) == ("failed", "job cancelled", True)


def test_a_label_change_leaves_a_claimed_run_alone(alice, api_settings):
    registry = registry_for(api_settings)
    job = alice.create(schedule={"run_at": format_instant(utcnow() + timedelta(seconds=3))})
    shard = job_row(api_settings, job["id"])["shard"]
    claim_batch(registry.engine_for_shard(shard), shard, utcnow(), api_settings)
    token = job_row(api_settings, job["id"])["lease_token"]

    alice.patch(f"/jobs/{job['id']}", json={"labels": {"team": "billing"}})

    assert job_row(api_settings, job["id"])["lease_token"] == token
    assert run_rows(api_settings, job["id"]) == []  # its row is its start's to write


@pytest.mark.parametrize(
    "body, fields",
    [
        ({}, ["labels"]),
        ({"labels": {}}, ["labels"]),
        ({"labels": {"team": "a b"}, "state": "x"}, ["state", "labels.team"]),
        ([1], ["body"]),
    ],
)
def test_a_label_verb_without_a_valid_selector_is_422_and_changes_nothing(alice, body, fields):
    job = _labelled(alice, {"team": "billing"})
    response = alice.post("/jobs/pause", json=body)
    assert response.status_code == 422
    assert [e["field"] for e in response.get_json()["errors"]] == fields
    assert alice.get(f"/jobs/{job['id']}").get_json()["state"] == "scheduled"


def test_the_sdk_and_the_cli_select_by_label(live_server, alice):
    client = Client(live_server, alice.api_key)
    made = client.create_job(
        "labelled",
        {"type": "webhook", "url": "http://127.0.0.1:9/hook"},
        {"interval_s": 60},
        labels={"team": "sdk", "env": "prod"},
    )
    assert made.labels == {"team": "sdk", "env": "prod"}
    assert [j.id for j in client.list_jobs(labels={"team": "sdk", "env": "prod"})] == [made.id]
    assert [j.id for j in client.iter_jobs(labels={"team": "sdk"})] == [made.id]
    assert client.pause_jobs({"team": "sdk"}) == Selected(1, 1)
    assert client.pause_jobs({"team": "sdk"}) == Selected(1, 0)

    runner = CliRunner()
    env = {"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": alice.api_key}

    def punctual(*args: str):
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert punctual("jobs", "resume", "--label", "team:sdk") == "resumed 1 of 1 matching jobs\n"
    listed = json.loads(punctual("jobs", "list", "--label", "team:sdk", "--label", "env:prod", "--json"))
    assert [j["id"] for j in listed["items"]] == [made.id]
    created = json.loads(
        punctual(
            "jobs",
            "create",
            "--name",
            "cli",
            "--interval-s",
            "60",
            "--target-url",
            "http://127.0.0.1:9/hook",
            "--label",
            "team:sdk",
            "--json",
        )
    )
    assert created["labels"] == {"team": "sdk"}
    assert json.loads(punctual("jobs", "cancel", "--label", "team:sdk", "--json")) == {
        "matched": 2,
        "changed": 2,
    }
    both = runner.invoke(main, ["jobs", "pause", made.id, "--label", "team:sdk"], env=env)
    assert both.exit_code == 2 and "not both" in both.output
