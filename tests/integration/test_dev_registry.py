"""Dev mode on the embedded registry: the /dev/echo target and the dev owner's key.

A real SQLite registry in a temp data dir (migrated as `punctual dev` does), the
real Flask app; no external service.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from app.api import create_app
from app.devserver import credentials
from app.registry.engines import registry_for
from app.registry.migrate import migrate_all
from app.services.owners import create_key
from app.settings import Settings
from punctual_client.signature import signature_header, verify_signature


@pytest.fixture
def dev_settings(tmp_path) -> Settings:
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATA_DIR": str(tmp_path / ".punctual"),
            "PUNCTUAL_DEV_MODE": "1",
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        }
    )
    migrate_all(settings.database_urls, shards=settings.shards)
    yield settings
    registry_for(settings).dispose()


@pytest.fixture
def client(dev_settings):
    return create_app(dev_settings).test_client()


def _job(client, api_key: str) -> dict:
    body = {
        "name": "echo",
        "target": {"type": "webhook", "url": "http://127.0.0.1:8000/dev/echo"},
        "schedule": {"interval_s": 60},
        "payload": {"hello": "world"},
    }
    response = client.post("/jobs", json=body, headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def _call_headers(job_id: str, secret: str, body: bytes) -> dict:
    return {
        "Punctual-Job-Id": job_id,
        "Idempotency-Key": f"{job_id}:2026-01-01T00:00:00Z",
        "Punctual-Signature": signature_header(secret, body),
        "Content-Type": "application/json",
    }


def test_a_job_created_on_the_embedded_registry_is_kept(client, dev_settings):
    key = create_key(registry_for(dev_settings), "dev")
    job = _job(client, key.api_key)
    again = client.get(f"/jobs/{job['id']}", headers={"Authorization": f"Bearer {key.api_key}"})
    assert again.status_code == 200 and again.get_json()["id"] == job["id"]


def test_echo_answers_a_call_with_what_it_got_and_lists_it(client, dev_settings):
    key = create_key(registry_for(dev_settings), "dev")
    job = _job(client, key.api_key)
    body = json.dumps({"hello": "world"}).encode()
    answer = client.post("/dev/echo", data=body, headers=_call_headers(job["id"], key.signing_secret, body))
    assert answer.status_code == 200
    call = answer.get_json()
    assert call["body"] == {"hello": "world"} and call["method"] == "POST"
    assert call["idempotency_key"] == f"{job['id']}:2026-01-01T00:00:00Z"
    assert call["signature"] == "valid"
    listed = client.get(f"/dev/echo?job_id={job['id']}").get_json()["items"]
    assert [c["idempotency_key"] for c in listed] == [call["idempotency_key"]]
    assert client.get("/dev/echo?job_id=someone-else").get_json()["items"] == []


def test_echo_gives_the_raw_body_a_signature_verifies_against(client, dev_settings):
    key = create_key(registry_for(dev_settings), "dev")
    job = _job(client, key.api_key)
    body = b'{"b": [1, 2],  "a": "\xc3\xa9"}'  # spacing and key order json.dumps would not reproduce
    client.post("/dev/echo", data=body, headers=_call_headers(job["id"], key.signing_secret, body))
    [call] = client.get(f"/dev/echo?job_id={job['id']}").get_json()["items"]
    assert call["raw_body"] == body.decode("utf-8") and call["body"] == {"b": [1, 2], "a": "é"}
    verify_signature(key.signing_secret, call["headers"]["Punctual-Signature"], call["raw_body"])


def test_echo_says_why_a_signature_does_not_verify(client, dev_settings):
    key = create_key(registry_for(dev_settings), "dev")
    job = _job(client, key.api_key)
    body = b'{"hello": "world"}'
    headers = _call_headers(job["id"], "whsec_not-the-secret", body)
    assert client.post("/dev/echo", data=body, headers=headers).get_json()["signature"].startswith("invalid:")
    unknown = _call_headers("00000000-0000-0000-0000-000000000000", key.signing_secret, body)
    assert client.post("/dev/echo", data=body, headers=unknown).get_json()["signature"].startswith("no job")


def test_echo_answers_the_status_it_is_asked_for(client):
    answer = client.put(
        "/dev/echo?status=503&retry_after=7", data=b"not json", headers={"Content-Type": "text/plain"}
    )
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "7"
    assert answer.get_json()["body"] == "not json"
    assert client.post("/dev/echo?status=abc").status_code == 422


def test_a_get_call_with_a_job_header_is_a_call_not_the_listing(client):
    answer = client.get("/dev/echo", headers={"Punctual-Job-Id": "x"})
    assert answer.get_json()["method"] == "GET"
    assert client.get("/dev/echo").get_json()["items"][0]["method"] == "GET"


def test_there_is_no_echo_outside_dev_mode(dev_settings):
    plain = create_app(Settings.from_env({"PUNCTUAL_DATA_DIR": str(dev_settings.data_dir)})).test_client()
    assert plain.post("/dev/echo").status_code == 404


def test_the_dev_key_is_created_once_kept_private_and_replaced_when_unknown(dev_settings):
    registry = registry_for(dev_settings)
    data_dir = dev_settings.data_dir
    first = credentials.dev_key(registry, data_dir)
    path = data_dir / credentials.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert credentials.dev_key(registry, data_dir) == first
    path.write_text(json.dumps({**first.as_dict(), "api_key": "pk_forgotten"}))
    replaced = credentials.dev_key(registry, data_dir)
    assert replaced.api_key != first.api_key and replaced.signing_secret == first.signing_secret
    env_file = credentials.write_env_file(data_dir, "http://127.0.0.1:8000", replaced)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f"export PUNCTUAL_API_KEY={replaced.api_key}" in env_file.read_text()


def test_the_env_file_exports_the_signing_secret_for_a_receiver(dev_settings):
    key = credentials.dev_key(registry_for(dev_settings), dev_settings.data_dir)
    env_file = credentials.write_env_file(dev_settings.data_dir, "http://127.0.0.1:8001", key)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCTUAL_", "WEBHOOK_"))}
    sourced = subprocess.run(
        ["bash", "-c", f'. "{env_file}" && env -0'], env=clean, capture_output=True, check=True
    ).stdout.decode()
    env = dict(line.split("=", 1) for line in sourced.split("\0") if "=" in line)
    assert env["WEBHOOK_SIGNING_SECRET"] == key.signing_secret  # what the README's receiver reads
    assert env["PUNCTUAL_URL"] == "http://127.0.0.1:8001" and env["PUNCTUAL_API_KEY"] == key.api_key
    Settings.from_env(env)  # nothing it sets is refused as an unknown PUNCTUAL_* variable


def test_labels_select_jobs_on_the_embedded_registry_too(client, dev_settings):
    key = create_key(registry_for(dev_settings), "dev")
    auth = {"Authorization": f"Bearer {key.api_key}"}
    made = {}
    for name, labels in (("a", {"team": "billing", "env": "prod"}), ("b", {"team": "billing"}), ("c", {})):
        body = {"name": name, "target": {"type": "webhook", "url": "http://127.0.0.1:8000/dev/echo"}}
        body.update(schedule={"interval_s": 60}, labels=labels)
        made[name] = client.post("/jobs", json=body, headers=auth).get_json()["id"]

    def listed(query: str) -> set[str]:
        return {job["id"] for job in client.get(f"/jobs?{query}", headers=auth).get_json()["items"]}

    assert listed("label=team:billing") == {made["a"], made["b"]}
    assert listed("label=team:billing&label=env:prod") == {made["a"]}
    paused = client.post("/jobs/pause", json={"labels": {"team": "billing"}}, headers=auth).get_json()
    assert paused == {"matched": 2, "changed": 2}
    assert listed("state=paused") == {made["a"], made["b"]}


def test_echo_shows_the_calls_traceparent_and_the_run_it_names(client, dev_settings):
    import uuid

    from app.tracing import traceparent

    key = create_key(registry_for(dev_settings), "dev")
    job = _job(client, key.api_key)
    run_id = uuid.uuid4()
    body = b"{}"
    headers = {**_call_headers(job["id"], key.signing_secret, body), "traceparent": traceparent(run_id)}
    call = client.post("/dev/echo", data=body, headers=headers).get_json()
    assert call["traceparent"] == traceparent(run_id) and call["run_id"] == str(run_id)
    untraced = client.post("/dev/echo", data=body, headers=_call_headers(job["id"], key.signing_secret, body))
    assert untraced.get_json()["traceparent"] is None and untraced.get_json()["run_id"] is None
