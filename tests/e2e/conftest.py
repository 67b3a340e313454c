"""End-to-end fixtures: real Postgres, RabbitMQ and Redis, real Celery processes,
the real API (its Flask app in the test process), and a local HTTP sink.

A module gets fresh databases and a fresh vhost (tests/conftest.py); `stack_env`
is the PUNCTUAL_* environment its processes run with (a module may override it),
and `stack` a worker and a beat shared by the module's tests.
"""

from __future__ import annotations

import time

import pytest

from app.api import create_app
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.settings import Settings
from tests.conftest import REDIS_URL, unique_redis_prefix
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.sink import Sink

pytestmark = pytest.mark.e2e

E2E_SHARDS = 4  # fewer shards than production's 16: fewer idle polls on a 2-core box


def make_env(pg_dsns, amqp_url, prefix: str, **overrides: str) -> dict[str, str]:
    env = {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_BROKER_URL": amqp_url,
        "PUNCTUAL_REDIS_URL": REDIS_URL,
        "PUNCTUAL_REDIS_PREFIX": prefix,
        "PUNCTUAL_SHARDS": str(E2E_SHARDS),
        "PUNCTUAL_POLL_INTERVAL_S": "0.25",
        "PUNCTUAL_LEASE_S": "3",
        "PUNCTUAL_HEARTBEAT_S": "1",
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_DB_POOL_SIZE": "4",
        "PUNCTUAL_DISPATCH_THREADS": "64",
    }
    env.update(overrides)
    return env


@pytest.fixture(scope="module")
def pg_shards() -> int:
    """The cluster pg_dsns makes has the e2e processes' shard count."""
    return E2E_SHARDS


@pytest.fixture(scope="module")
def module_redis_prefix():
    with unique_redis_prefix("e2e") as prefix:
        yield prefix


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix) -> dict[str, str]:
    return make_env(pg_dsns, amqp_url, module_redis_prefix)


@pytest.fixture(scope="module")
def settings(stack_env) -> Settings:
    return Settings.from_env(stack_env)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def sink():
    server = Sink()
    yield server
    server.close()


class Api:
    """The real API app (Flask test client) for one owner."""

    def __init__(self, settings: Settings, owner: str = "e2e"):
        self.client = create_app(settings).test_client()
        key = create_key(registry_for(settings), owner)
        self.headers = {"Authorization": f"Bearer {key.api_key}"}
        self.secret = key.signing_secret

    def request(self, method: str, path: str, body=None, expect: int | None = None):
        response = self.client.open(path, method=method, json=body, headers=self.headers)
        if expect is not None:
            assert response.status_code == expect, (response.status_code, response.get_json())
        return response.get_json()

    def create(self, **body) -> dict:
        body.setdefault("name", "e2e")
        return self.request("POST", "/jobs", body, expect=201)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/jobs/{job_id}", expect=200)

    def runs(self, job_id: str) -> list[dict]:
        """The run history, oldest first."""
        return list(reversed(self.request("GET", f"/jobs/{job_id}/runs?limit=500", expect=200)["items"]))

    def wait_job(self, job_id: str, predicate, timeout_s: float = 30.0) -> dict:
        return _wait(
            lambda: self.job(job_id), predicate, timeout_s, lambda j: f"job {job_id} stayed {j['state']}"
        )

    def wait_runs(self, job_id: str, predicate, timeout_s: float = 30.0) -> list[dict]:
        return _wait(
            lambda: self.runs(job_id),
            predicate,
            timeout_s,
            lambda h: f"runs of {job_id}: {[(r['attempt'], r['state']) for r in h]}",
        )


def _wait(fetch, predicate, timeout_s: float, describe):
    deadline = time.monotonic() + timeout_s
    while True:
        current = fetch()
        if predicate(current):
            return current
        if time.monotonic() > deadline:
            raise TimeoutError(describe(current))
        time.sleep(0.1)


@pytest.fixture(scope="module")
def api(settings) -> Api:
    return Api(settings)


@pytest.fixture(scope="module")
def stack(stack_env, logs):
    """One worker (prefork, 2 processes) and one beat for the module's tests."""
    worker = start_worker(stack_env, logs)
    beat = start_beat(stack_env, logs)
    wait_ready(worker, 2.0)
    wait_ready(beat, 0.5)
    yield worker, beat
    beat.stop()
    worker.stop()
