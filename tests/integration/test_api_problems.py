"""Every error is application/problem+json: 400, 401, 404, 405, 409, 413, 415, 422."""

from __future__ import annotations

import json

import pytest

from tests.integration.api_fixtures import job_body

pytestmark = pytest.mark.integration

PROBLEM_KEYS = {"type", "title", "status", "detail", "errors"}


def assert_problem(response, status):
    assert response.status_code == status
    assert response.mimetype == "application/problem+json"
    body = response.get_json(force=True)
    assert set(body) == PROBLEM_KEYS and body["status"] == status
    return body


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer pk_nope"},
        {"Authorization": "Basic dXNlcjpwdw=="},
        {"Authorization": "Bearer "},
    ],
)
def test_no_or_bad_key_is_401(api_app, headers):
    response = api_app.test_client().get("/jobs", headers=headers)
    assert_problem(response, 401)
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_bearer_scheme_is_case_insensitive(alice):
    response = alice.client.get("/jobs", headers={"Authorization": f"bearer {alice.api_key}"})
    assert response.status_code == 200


def test_malformed_json_is_400(alice):
    for raw in (b"{", b"", b'{"name": NaN}', b'{"n": Infinity}', b"[1e400]", b"\xff\xfe"):
        assert_problem(alice.post("/jobs", data=raw, headers={"Content-Type": "application/json"}), 400)


def test_deep_nesting_is_400_not_500(alice):
    raw = b"[" * 30_000 + b"]" * 30_000
    assert len(raw) < 64 * 1024
    assert_problem(alice.post("/jobs", data=raw, headers={"Content-Type": "application/json"}), 400)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415(alice, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    assert_problem(alice.post("/jobs", data=json.dumps(job_body()), headers=headers), 415)


def test_json_with_charset_or_a_json_suffix_is_accepted(alice):
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = alice.post("/jobs", data=json.dumps(job_body()), headers={"Content-Type": content_type})
        assert response.status_code == 201, content_type


def test_a_body_over_64_kib_is_413(alice):
    body = job_body(payload={"blob": "x" * (64 * 1024)})
    assert_problem(alice.post("/jobs", json=body), 413)
    just_under = job_body(payload={"blob": "x" * (60 * 1024)})
    assert alice.post("/jobs", json=just_under).status_code == 201


def test_patch_checks_the_body_too(alice):
    job = alice.create()
    assert_problem(
        alice.patch(f"/jobs/{job['id']}", data=b"name=x", headers={"Content-Type": "text/plain"}), 415
    )
    assert_problem(
        alice.patch(f"/jobs/{job['id']}", data=b"{", headers={"Content-Type": "application/json"}), 400
    )
    assert_problem(alice.patch(f"/jobs/{job['id']}", json=[1]), 422)


def test_unknown_route_is_a_404_problem(api_app):
    assert_problem(api_app.test_client().get("/nowhere"), 404)


def test_wrong_method_is_a_405_problem_with_allow(alice):
    response = alice.client.put("/jobs", headers={"Authorization": f"Bearer {alice.api_key}"})
    assert_problem(response, 405)
    assert "GET" in response.headers["Allow"] and "POST" in response.headers["Allow"]


def test_422_lists_fields_and_409_says_why(alice, api_settings):
    body = assert_problem(alice.post("/jobs", json={"name": 5}), 422)
    assert {e["field"] for e in body["errors"]} == {"name", "target", "schedule"}
    job = alice.create()
    alice.delete(f"/jobs/{job['id']}")
    conflict = assert_problem(alice.post(f"/jobs/{job['id']}/pause"), 409)
    assert "cancelled" in conflict["detail"]
