"""Owner isolation: another owner's job or run is a 404 on every endpoint, never a 403."""

from __future__ import annotations

import pytest

from tests.integration.api_fixtures import insert_run, job_body, job_row, run_rows

pytestmark = pytest.mark.integration

ENDPOINTS = [
    ("get", "/jobs/{job}", None),
    ("patch", "/jobs/{job}", {"name": "stolen"}),
    ("delete", "/jobs/{job}", None),
    ("post", "/jobs/{job}/pause", None),
    ("post", "/jobs/{job}/resume", None),
    ("post", "/jobs/{job}/trigger", None),
    ("get", "/jobs/{job}/runs", None),
    ("post", "/runs/{run}/replay", None),
]


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
def test_another_owners_job_is_404_and_left_untouched(alice, bob, api_settings, method, path, body):
    job = alice.create()
    run = insert_run(api_settings, job)
    before = job_row(api_settings, job["id"])
    kwargs = {"json": body} if body is not None else {}
    response = getattr(bob, method)(path.format(job=job["id"], run=run["run_id"]), **kwargs)
    assert response.status_code == 404
    assert response.mimetype == "application/problem+json"
    assert job_row(api_settings, job["id"]) == before
    assert [r["state"] for r in run_rows(api_settings, job["id"])] == ["dead"]
    # and the owner still can
    assert getattr(alice, method)(path.format(job=job["id"], run=run["run_id"]), **kwargs).status_code < 300


def test_listings_show_only_the_owners_own(alice, bob, api_settings):
    job = alice.create()
    insert_run(api_settings, job)
    assert bob.get("/jobs").get_json()["items"] == []
    assert bob.get("/dead-letters").get_json()["items"] == []
    assert len(alice.get("/dead-letters").get_json()["items"]) == 1


def test_the_same_idempotency_key_never_reaches_another_owners_job(alice, bob):
    key = {"Idempotency-Key": "same"}
    mine = alice.post("/jobs", json=job_body(), headers=key)
    theirs = bob.post(
        "/jobs", json={"name": "x"}, headers=key
    )  # invalid body: no existing job of bob's to answer
    assert mine.status_code == 201 and theirs.status_code == 422
