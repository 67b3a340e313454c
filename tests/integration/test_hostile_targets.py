"""One owner's hostile target cannot stop a worker from recording every other owner's runs.

The real API creates the jobs, the in-process worker (real aiohttp, Postgres, Redis)
calls a local sink and records the outcomes.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest

from app import metrics
from app.api import create_app
from app.core.timefmt import parse_instant, utcnow
from app.lifecycle import completion
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.worker.context import WorkerContext
from tests.sink import Answer, Sink

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    server = Sink()
    yield server
    server.close()


@pytest.fixture
def stack(pg_settings, truncate):
    truncate()
    settings = dataclasses.replace(pg_settings, lease_s=5.0, heartbeat_s=0.5)
    context = WorkerContext(settings)
    yield settings, create_app(settings).test_client(), context
    context.close(5)


class Owner:
    def __init__(self, settings, client, name: str):
        self.client = client
        self.headers = {"Authorization": f"Bearer {create_key(registry_for(settings), name).api_key}"}

    def one_off(self, url: str) -> str:
        body = {
            "name": "hostile",
            "target": {"type": "webhook", "url": url},
            "schedule": {"run_at": (utcnow() - timedelta(seconds=1)).isoformat()},
            "retry": {"max_attempts": 3, "backoff_s": 60},
        }
        response = self.client.post("/jobs", json=body, headers=self.headers)
        assert response.status_code == 201, response.get_json()
        return response.get_json()["id"]

    def job(self, job_id: str) -> dict:
        return self.client.get(f"/jobs/{job_id}", headers=self.headers).get_json()

    def runs(self, job_id: str) -> list[dict]:
        return self.client.get(f"/jobs/{job_id}/runs", headers=self.headers).get_json()["items"]


def dispatch_due(settings, context) -> int:
    """Claim every due job, as the pollers would, and hand the runs to the worker."""
    registry = registry_for(settings)
    found = []
    for shard in range(settings.shards):
        found += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), settings).runs
    return context.dispatcher.dispatch(found).started


def wait_until(predicate, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def test_a_retry_after_of_400_digits_leaves_every_other_owners_runs_recorded(stack, sink):
    settings, client, context = stack
    hostile, other = Owner(settings, client, "hostile"), Owner(settings, client, "other")
    sink.script("/hostile", [Answer(503, headers={"Retry-After": "9" * 400})])
    poisoned = hostile.one_off(sink.url("/hostile"))
    fine = [other.one_off(sink.url(f"/fine{i}")) for i in range(6)]
    assert dispatch_due(settings, context) == 7
    wait_until(lambda: all(other.job(j)["state"] == "completed" for j in fine))
    [run] = wait_until(lambda: [r for r in hostile.runs(poisoned) if r["state"] == "failed"])
    assert run["status_code"] == 503 and run["error"] == "HTTP 503"
    # The Retry-After was unusable: the job's own backoff (60 s x 0.5-1.0) decides.
    delay_s = (
        parse_instant(hostile.job(poisoned)["next_run_at"]) - parse_instant(run["finished_at"])
    ).total_seconds()
    assert 29 <= delay_s <= 61
    # And the worker goes on recording what comes after.
    later = [other.one_off(sink.url(f"/later{i}")) for i in range(3)]
    assert dispatch_due(settings, context) == 3
    wait_until(lambda: all(other.job(j)["state"] == "completed" for j in later))
    assert context.dispatcher.in_flight() == 0


def test_an_outcome_the_registry_refuses_is_recorded_as_failed_and_the_batch_is_written(
    stack, sink, monkeypatch
):
    """A write that fails for one run only (here: an error text made unstorable on
    purpose) is found by halving the batch; that run is recorded as a failed attempt
    saying why, the others as they finished."""
    settings, client, context = stack
    recordable = completion.recordable
    monkeypatch.setattr(
        completion, "recordable", lambda text: "NUL \x00" if text == "HTTP 599" else recordable(text)
    )
    hostile, other = Owner(settings, client, "hostile"), Owner(settings, client, "other")
    sink.script("/refused", [Answer(599, delay_s=0.3)])
    for i in range(8):
        sink.script(f"/fine{i}", [Answer(200, delay_s=0.3)])  # finish together: one batch
    refused = hostile.one_off(sink.url("/refused"))
    fine = [other.one_off(sink.url(f"/fine{i}")) for i in range(8)]
    given_up = metrics.COMPLETIONS_GIVEN_UP._value.get()
    assert dispatch_due(settings, context) == 9
    wait_until(lambda: all(other.job(j)["state"] == "completed" for j in fine))
    [run] = wait_until(lambda: [r for r in hostile.runs(refused) if r["state"] == "failed"])
    assert run["error"].startswith("the outcome could not be recorded (DataError: ")
    assert hostile.job(refused)["state"] == "scheduled" and hostile.job(refused)["attempt"] == 1
    assert metrics.COMPLETIONS_GIVEN_UP._value.get() == given_up
    wait_until(lambda: context.dispatcher.in_flight() == 0)
