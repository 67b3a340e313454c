"""What one owner holding an API key may send, answered by the contract ("Bounds"):
422 at the field's path, per item in a batch, 429 for triggers, never a 500."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from app.registry.engines import registry_for
from app.services.owners import OwnerDirectory, create_key
from tests.integration.api_fixtures import job_body

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def fields(response) -> list[str]:
    assert response.status_code == 422 and response.mimetype == PROBLEM, response.get_data(as_text=True)[:300]
    return [e["field"] for e in response.get_json()["errors"]]


@pytest.mark.parametrize("key", [None, "deep-1"])
def test_a_payload_nested_600_levels_is_422_at_payload_with_or_without_an_idempotency_key(alice, key, caplog):
    headers = {"Idempotency-Key": key} if key else None
    response = alice.post("/jobs", json=job_body(payload=nested(600)), headers=headers)
    assert fields(response) == ["payload"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # The key was not used up: the same key with a valid body creates the job.
    if key:
        assert alice.post("/jobs", json=job_body(), headers=headers).status_code == 201


def test_nesting_is_counted_in_levels_64_taken_65_refused(alice):
    assert alice.post("/jobs", json=job_body(payload=nested(63))).status_code == 201  # 63 lists + a leaf
    assert alice.post("/jobs", json=job_body(payload=nested(64))).status_code == 201
    assert fields(alice.post("/jobs", json=job_body(payload=nested(65)))) == ["payload"]
    empty_65 = nested(64)
    inner = empty_65
    for _ in range(63):
        inner = inner[0]  # type: ignore[index]
    inner[0] = []  # type: ignore[index]  # 65 nested lists, the innermost empty
    assert fields(alice.post("/jobs", json=job_body(payload=empty_65))) == ["payload"]
    job = alice.create()
    assert fields(alice.patch(f"/jobs/{job['id']}", json={"payload": nested(600)})) == ["payload"]


def test_a_field_path_with_a_lone_surrogate_is_answered_not_a_500(alice):
    """JSON allows "\\ud800"; an unknown field so named is echoed in the problem's path,
    written as JSON's escape (UTF-8 cannot carry the character itself)."""
    raw = '{"jobs": [{"name": "x", "\\ud800": 1}]}'
    response = alice.post("/jobs/batch", data=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    [item] = response.get_json()["items"]
    assert item["status"] == 422 and "\ud800" in [e["field"] for e in item["problem"]["errors"]]


def test_a_batch_answers_each_hostile_item_on_its_own(alice):
    items = [
        {**job_body(payload=nested(600)), "idempotency_key": "deep-in-a-batch"},
        None,
        job_body(name="fine"),
        job_body(schedule={"cron": ",".join(["1"] * 20_000) + " * * * *"}),
        42,
    ]
    response = alice.post("/jobs/batch", json={"jobs": items})
    assert response.status_code == 200, response.get_json()
    answers = response.get_json()["items"]
    assert [a["status"] for a in answers] == [422, 422, 201, 422, 422]
    assert [[e["field"] for e in a["problem"]["errors"]] for a in answers if a["status"] == 422] == [
        ["payload"],
        ["body"],
        ["schedule.cron"],
        ["body"],
    ]


@pytest.mark.parametrize(
    "target, field",
    [
        (
            {"type": "webhook", "url": "http://127.0.0.1:9/", "headers": {"X-Evil\n": "v"}},
            "target.headers.X-Evil\n",
        ),
        ({"type": "queue", "topic": "reports.daily\n"}, "target.topic"),
        ({"type": "webhook", "url": "http://127.0.0.1:9/a\x7fb"}, "target.url"),
        (
            {"type": "webhook", "url": "http://127.0.0.1:9/", "headers": {"X-Nel": "a\u0085b"}},
            "target.headers.X-Nel",
        ),
        ({"type": "webhook", "url": "http://134744072/"}, "target.url"),
        ({"type": "webhook", "url": "http://127.1:9/"}, "target.url"),
    ],
)
def test_what_the_worker_could_not_call_is_refused_at_create(alice, target, field):
    assert fields(alice.post("/jobs", json=job_body(target=target))) == [field]
    answer = alice.post("/jobs/batch", json={"jobs": [job_body(target=target), job_body()]}).get_json()
    assert [a["status"] for a in answer["items"]] == [422, 201]


def test_a_cron_over_its_bounds_is_422_naming_the_bound(alice):
    long = ",".join(["1"] * 20_000) + " * * * *"
    response = alice.post("/jobs", json=job_body(schedule={"cron": long}))
    assert fields(response) == ["schedule.cron"] and "256 characters" in response.get_data(as_text=True)
    items = ",".join(str(n % 60) for n in range(61)) + " * * * *"
    response = alice.post("/jobs", json=job_body(schedule={"cron": items}))
    assert fields(response) == ["schedule.cron"] and "at most 60" in response.get_data(as_text=True)
    assert fields(alice.get("/schedules/preview", query_string={"cron": long})) == ["cron"]


def test_a_large_body_is_413_naming_the_figure(alice):
    response = alice.post("/jobs", json=job_body(payload="x" * (64 * 1024)))
    assert response.status_code == 413 and response.mimetype == PROBLEM
    assert "64 KiB" in response.get_json()["detail"]
    response = alice.post("/jobs/batch", json={"jobs": [job_body(payload="x" * 60_000)] * 140})
    assert response.status_code == 413 and "8 MiB" in response.get_json()["detail"]


def test_triggers_are_limited_per_job_across_api_processes_and_when_paused(api_settings, alice):
    from app.api import create_app

    other_process = create_app(api_settings).test_client()  # another API process's app
    job = alice.create()
    first_trigger = time.monotonic()
    for n in range(10):  # half through each process
        if n % 2:
            assert alice.post(f"/jobs/{job['id']}/trigger").status_code == 202
        else:
            answer = other_process.post(f"/jobs/{job['id']}/trigger", headers=alice._headers(None))
            assert answer.status_code == 202
    refused = alice.post(f"/jobs/{job['id']}/trigger")
    assert refused.status_code == 429 and refused.mimetype == PROBLEM
    problem = refused.get_json()
    assert (
        problem["type"] == "urn:punctual:problem:rate-limited"
        and "at most 10 times in 60 s" in problem["detail"]
    )
    # The window frees when the first of the ten leaves it, 60 s after it was taken.
    since_first = time.monotonic() - first_trigger
    assert 60 - since_first - 1 <= int(refused.headers["Retry-After"]) <= 60
    # Paused, it is limited all the same; another job of the owner is not.
    assert alice.post(f"/jobs/{job['id']}/pause").status_code == 200
    assert alice.post(f"/jobs/{job['id']}/trigger").status_code == 429
    assert alice.post(f"/jobs/{alice.create()['id']}/trigger").status_code == 202


def test_a_flood_of_made_up_api_keys_keeps_the_key_cache_bounded(api_settings):
    registry = registry_for(api_settings)
    known = create_key(registry, f"flood-{uuid.uuid4().hex[:8]}")
    directory = OwnerDirectory(registry)
    directory._owners.size = directory._unknown.size = 20
    assert directory.authenticate(known.api_key) == known.owner
    for n in range(200):
        assert directory.authenticate(f"pk_made_up_{n}") is None
    assert len(directory._unknown) == 20 and len(directory._owners) == 1  # known keys are not pushed out
    assert directory.authenticate(known.api_key) == known.owner


def test_any_of_these_is_never_a_500(alice, bob):
    """One request of each kind, every answer a problem or a success."""
    job = bob.create()
    for response in (
        alice.post("/jobs", json=job_body(payload=nested(900)), headers={"Idempotency-Key": "k"}),
        alice.post("/jobs/batch", json={"jobs": [{**job_body(payload=nested(900)), "idempotency_key": "k"}]}),
        alice.post(f"/jobs/{job['id']}/trigger"),
        alice.get("/jobs", query_string={"limit": "\u0661\u0660"}),
        alice.get("/jobs", query_string={"cursor": "\u00b2" * 10}),
        alice.get("/schedules/preview", query_string={"cron": "5\n,6 * * * *"}),
    ):
        assert response.status_code < 500, response.get_data(as_text=True)[:300]
