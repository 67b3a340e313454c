"""Flower (`celery -A app flower`) shows Punctual's workers, their shard queues and its tasks.

Real processes on real services: a worker and beat (tests/e2e/processes.py) on a
fresh RabbitMQ vhost and two fresh Postgres shards, Flower on a free port with
basic auth (Flower 2 serves its HTTP API only behind authentication). A job due
now against a local sink makes a dispatch task run; beat's ticks make poll tasks
run. The test reads Flower's HTTP API: /api/workers and /api/tasks. Every wait
is bounded; teardown stops every process it started.
"""
from __future__ import annotations

import socket
import time

import pytest
import requests

from app.api import create_app
from app.core.timefmt import format_instant, utcnow
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.settings import Settings
from tests.e2e.processes import CELERY, Proc, start_beat, wait_ready
from tests.sink import Sink

pytestmark = pytest.mark.integration

SHARDS = 4  # fewer shards, fewer idle polls
AUTH = ("punctual", "flower-test")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(fetch, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if last:
                return last
        except requests.RequestException as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s:g}s (last: {last!r})")


@pytest.fixture(scope="module")
def env(pg_dsns, amqp_url) -> dict[str, str]:
    return {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_BROKER_URL": amqp_url,
        "PUNCTUAL_SHARDS": str(SHARDS),
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_DB_POOL_SIZE": "2",
        "PUNCTUAL_DISPATCH_THREADS": "8",
    }


@pytest.fixture(scope="module")
def flower(env, tmp_path_factory):
    logs = tmp_path_factory.mktemp("flower-logs")
    port = _free_port()
    processes = []
    try:
        # As docker-compose.yml starts workers: gossip, mingle and heartbeats on, so the
        # worker has an event dispatcher that Flower's enable_events can switch on
        # (tests/e2e's workers run without them, and then send no task events at all).
        queues = ",".join(f"shard-{s:02d}" for s in range(SHARDS))
        worker = Proc("worker", [CELERY, "-A", "app", "worker", "--loglevel", "INFO", "-n", "flower-test@%h",
                                 "-Q", queues, "-c", "2"], env, logs)
        processes.append(worker)
        beat = start_beat(env, logs)
        processes.append(beat)
        wait_ready(worker, 2.0)
        flower_proc = Proc("flower", [CELERY, "-A", "app", "flower", f"--port={port}", "--address=127.0.0.1",
                                      f"--basic_auth={AUTH[0]}:{AUTH[1]}"], env, logs)
        processes.append(flower_proc)
        url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: requests.get(f"{url}/healthcheck", timeout=2).ok, 60, "Flower answering")
        yield url, processes
    finally:
        for proc in reversed(processes):
            proc.stop(timeout_s=15)


def _workers(url: str) -> dict:
    return requests.get(f"{url}/api/workers", params={"refresh": "1"}, auth=AUTH, timeout=15).json()


def _tasks(url: str, name: str, state: str) -> dict:
    return requests.get(f"{url}/api/tasks", params={"taskname": name, "state": state}, auth=AUTH, timeout=10).json()


def test_flower_lists_the_worker_and_its_shard_queues(flower):
    url, processes = flower
    workers = _wait_for(lambda: {k: v for k, v in _workers(url).items() if k.startswith("flower-test@")}, 60,
                        "the worker in /api/workers")
    [(name, info)] = workers.items()
    queues = sorted(q["name"] for q in info["active_queues"])
    assert queues == [f"shard-{s:02d}" for s in range(SHARDS)], queues
    assert {"punctual.poll", "punctual.sweep", "punctual.dispatch"} <= set(info["registered"])


def test_flower_lists_poll_and_dispatch_tasks_once_they_ran(flower, env):
    url, processes = flower
    # Beat's polls show once Flower has switched the worker's task events on
    # (enable_events, sent when Flower starts and again every few seconds).
    polls = _wait_for(lambda: _tasks(url, "punctual.poll", state="SUCCESS"), 60, "a succeeded poll task in /api/tasks")
    assert all(task["worker"].startswith("flower-test@") for task in polls.values())
    settings = Settings.from_env(env)
    sink = Sink()
    try:
        key = create_key(registry_for(settings), "flower")
        client = create_app(settings).test_client()
        response = client.post("/jobs", json={"name": "flower", "target": {"type": "webhook", "url": sink.url("/f")},
                                              "schedule": {"run_at": format_instant(utcnow())}},
                               headers={"Authorization": f"Bearer {key.api_key}"})
        assert response.status_code == 201, response.get_json()
        sink.wait_for(1, "/f", timeout_s=60)
        dispatches = _wait_for(lambda: _tasks(url, "punctual.dispatch", state="SUCCESS"), 60,
                               "a succeeded dispatch task in /api/tasks")
    finally:
        sink.close()
    [dispatch] = dispatches.values()
    assert dispatch["worker"].startswith("flower-test@")
    assert response.get_json()["id"] in dispatch["kwargs"]  # the batch names the job's run
