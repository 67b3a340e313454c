"""The SDK against the real app on a real HTTP server (no mocks)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import requests

from punctual_client import (
    ArgumentError,
    AuthenticationError,
    Client,
    ConflictError,
    Job,
    NotFoundError,
    PayloadTooLargeError,
    PunctualError,
    Run,
    TransportError,
    ValidationError,
    WaitTimeoutError,
    verify_signature,
)
from punctual_client.signature import signature_header
from tests.integration.api_fixtures import WEBHOOK, insert_run

pytestmark = pytest.mark.integration
CRON = {"cron": "0 0 * * *", "timezone": "Europe/Berlin"}


@pytest.fixture
def client(live_server, alice):
    with Client(live_server, alice.api_key) as sdk:
        yield sdk


def test_create_get_update_and_typed_results(client):
    job = client.create_job("sdk-job", WEBHOOK, CRON, {"k": 1}, retry={"max_attempts": 2}, jitter_s=5)
    assert isinstance(job, Job) and job.state == "scheduled" and job.payload == {"k": 1}
    assert job.next_run_at.tzinfo is not None and job.created_at <= datetime.now(UTC)
    assert client.get_job(job.id) == job
    updated = client.update_job(job.id, name="renamed", schedule={"interval_s": 60})
    assert updated.name == "renamed" and updated.schedule == {"interval_s": 60}


def test_datetimes_are_sent_as_rfc3339(client):
    at = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    job = client.create_job("one-off", WEBHOOK, {"run_at": at})
    assert job.next_run_at == at and job.schedule == {"run_at": "2030-01-01T12:00:00Z"}
    with pytest.raises(ValidationError) as exc:
        client.create_job("naive", WEBHOOK, {"run_at": datetime(2030, 1, 1)})
    assert exc.value.errors[0].field == "schedule.run_at"


def test_idempotency_key(client):
    key = f"sdk-{uuid.uuid4()}"
    first = client.create_job("idem", WEBHOOK, CRON, idempotency_key=key)
    assert client.create_job("idem", WEBHOOK, CRON, idempotency_key=key).id == first.id
    with pytest.raises(ConflictError):
        client.create_job("different", WEBHOOK, CRON, idempotency_key=key)


def test_lifecycle_verbs(client):
    job = client.create_job("verbs", WEBHOOK, CRON)
    assert client.pause_job(job.id).state == "paused"
    assert client.resume_job(job.id).state == "scheduled"
    run = client.trigger_job(job.id)
    assert isinstance(run, Run) and run.state == "claimed" and run.attempt == 1
    assert [r.id for r in client.iter_runs(job.id)] == [run.id]
    assert client.cancel_job(job.id).state == "cancelled"
    with pytest.raises(ConflictError) as exc:
        client.trigger_job(job.id)
    assert exc.value.status == 409 and "cancelled" in exc.value.detail


def test_iterators_follow_cursors(client):
    created = {client.create_job(f"iter-{i}", WEBHOOK, CRON).id for i in range(7)}
    page = client.list_jobs(limit=3)
    assert len(page) == 3 and page.next_cursor is not None
    assert {j.id for j in client.iter_jobs(page_size=2)} == created
    assert [j.name for j in client.iter_jobs(name="iter-3")] == ["iter-3"]


def test_dead_letters_and_replay(client, api_settings):
    job = client.create_job("dl", WEBHOOK, {"interval_s": 60})
    dead = insert_run(api_settings, job.raw)
    [letter] = list(client.iter_dead_letters())
    assert letter.id == str(dead["run_id"]) and letter.status_code == 500
    replayed = client.replay_run(letter.id)
    assert replayed.state == "replayed"
    assert client.list_dead_letters().items == []


def test_preview(client):
    items = client.preview_schedule(
        "30 2 * * *", timezone="Europe/Berlin", count=2, after=datetime(2026, 3, 28, 12, tzinfo=UTC)
    )
    assert [i.dst for i in items] == ["gap_shifted", None]
    assert items[0].at == datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert items[0].local.utcoffset().total_seconds() == 7200


def test_errors_map_to_the_exception_tree(client, live_server, bob):
    with pytest.raises(ValidationError) as exc:
        client.create_job("", {"type": "webhook", "url": "ftp://x"}, {"cron": "nope"})
    assert {e.field for e in exc.value.errors} == {"name", "target.url", "schedule.cron"}
    with pytest.raises(NotFoundError):
        client.get_job(str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        Client(live_server, bob.api_key).get_job(client.create_job("mine", WEBHOOK, CRON).id)
    with pytest.raises(AuthenticationError):
        Client(live_server, "pk_wrong").list_jobs()
    with pytest.raises(PayloadTooLargeError):
        client.create_job("big", WEBHOOK, CRON, {"blob": "x" * 70_000})


def test_transport_errors_when_nobody_answers():
    with pytest.raises(TransportError) as exc:
        Client("http://127.0.0.1:9", "pk_x", timeout_s=2).list_jobs()
    # One attempt, said plainly: not urllib3's "Max retries exceeded" (the client never retries).
    assert exc.value.reason == "connection refused"
    assert str(exc.value) == "GET http://127.0.0.1:9/jobs: connection refused"
    adapter = Client("http://127.0.0.1:9", "pk_x").session.get_adapter("http://127.0.0.1:9/")
    assert adapter.max_retries.total == 0 and adapter.max_retries.connect == 0


def test_values_the_client_cannot_use_are_refused_before_anything_is_sent(live_server):
    for url, key, why in (
        (live_server, "", "api_key is empty"),
        (live_server, "  ", "api_key is empty"),
        ("localhost:8000", "pk_x", "has no http:// or https:// scheme"),
        ("ftp://example.com", "pk_x", r"is not an http\(s\) URL"),
        ("http://", "pk_x", "has no host"),
    ):
        with pytest.raises(ArgumentError, match=why) as exc:
            Client(url, key)
        assert isinstance(exc.value, PunctualError) and isinstance(exc.value, ValueError)
    with pytest.raises(ArgumentError, match="batch_size=5000: must be an integer from 1 to 1000"):
        Client(live_server, "pk_x").create_jobs([{"name": "x"}], batch_size=5000)


def test_wait_for_run_returns_the_run_that_ended(client, api_settings):
    job = client.create_job("waited", WEBHOOK, CRON)
    with pytest.raises(WaitTimeoutError, match="it has no run yet") as exc:
        client.wait_for_run(job.id, timeout_s=0.3, poll_s=0.1)
    assert isinstance(exc.value, TimeoutError) and isinstance(exc.value, PunctualError)
    insert_run(api_settings, job.raw, state="running", status_code=None, error=None, finished_at=None)
    with pytest.raises(WaitTimeoutError, match="its newest run is running"):
        client.wait_for_run(job.id, timeout_s=0.3, poll_s=0.1)
    done = insert_run(api_settings, job.raw, state="succeeded", attempt=1, status_code=200, error=None)
    run = client.wait_for_run(job.id, timeout_s=5)
    assert isinstance(run, Run) and run.id == str(done["run_id"]) and run.state == "succeeded"
    later = datetime(2099, 1, 1, tzinfo=UTC)  # no occurrence of it has ended
    with pytest.raises(WaitTimeoutError):
        client.wait_for_run(job.id, since=later, timeout_s=0.2, poll_s=0.1)
    assert client.wait_for_run(job.id, states=("running",), timeout_s=1).state == "running"
    with pytest.raises(NotFoundError):
        client.wait_for_run(str(uuid.uuid4()), timeout_s=1)


def test_job_fields_come_back_as_the_typed_dicts_they_were_sent_as(client):
    from punctual_client import CronSchedule, WebhookTarget

    target: WebhookTarget = {"type": "webhook", "url": WEBHOOK["url"], "method": "PUT"}
    schedule: CronSchedule = {"cron": "0 0 * * *", "timezone": "Europe/Berlin"}
    job = client.create_job("typed", target, schedule)
    assert job.target["type"] == "webhook" and job.target["method"] == "PUT"
    assert job.schedule == schedule and job.state == "scheduled" and job.retry["max_attempts"] == 5


def test_an_injected_session_is_used_and_not_closed(live_server, alice):
    session = requests.Session()
    seen = []
    session.hooks["response"].append(lambda response, *a, **k: seen.append(response.request.method))
    with Client(live_server, alice.api_key, session=session) as sdk:
        sdk.list_jobs()
    assert seen == ["GET"]
    session.get(f"{live_server}/healthz")  # still open
    assert Client(live_server, alice.api_key, session=session).health()["shards"][0]["ok"] is True


def test_verify_signature_is_exported_for_receivers():
    body = b'{"any": "json"}'
    header = signature_header("whsec_test", body)
    assert verify_signature("whsec_test", header, body) is None  # one behaviour: None, or SignatureError
