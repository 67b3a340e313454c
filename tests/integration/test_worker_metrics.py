"""One metrics endpoint per worker, counting every prefork child.

Real `celery -A app worker -c 2` processes on a fresh vhost and fresh databases,
with PUNCTUAL_METRICS_PORT set. The test sends poll tasks straight to the shard
queues (each poll makes exactly one claim transaction, observed in
punctual_claim_batch_size), scrapes the worker's one port, and finds the count of
every poll, whichever child ran it. Two workers on one host, on two ports, both
serve; neither collides with the other.
"""

from __future__ import annotations

import re
import socket
import time

import pytest
import requests
from celery import Celery

from tests.e2e.processes import CELERY, Proc, wait_ready

pytestmark = pytest.mark.integration

SHARDS = 2
PG_SHARDS = SHARDS  # the cluster pg_dsns makes (tests/conftest.py)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sample(text: str, name: str) -> float:
    """The sum of every sample of `name` (all label sets)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def _scrape(port: int) -> str:
    return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


@pytest.fixture(scope="module")
def env(pg_dsns, amqp_url) -> dict[str, str]:
    return {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_BROKER_URL": amqp_url,
        "PUNCTUAL_SHARDS": str(SHARDS),
        "PUNCTUAL_DB_POOL_SIZE": "2",
        "PUNCTUAL_DISPATCH_THREADS": "4",
    }


def _worker(env: dict, log_dir, name: str, port: int, extra_env: dict | None = None) -> Proc:
    queues = ",".join(f"shard-{s:02d}" for s in range(SHARDS))
    argv = [
        CELERY,
        "-A",
        "app",
        "worker",
        "-Q",
        queues,
        "-c",
        "2",
        "-n",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    return Proc(name, argv, {**env, "PUNCTUAL_METRICS_PORT": str(port), **(extra_env or {})}, log_dir)


def _wait_serving(proc: Proc, port: int, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            return _scrape(port)
        except requests.RequestException:
            time.sleep(0.3)
    raise AssertionError(f"{proc.name} serves no metrics on :{port}:\n{proc.tail()}")


def _send_polls(amqp_url: str, count: int) -> None:
    sender = Celery(broker=amqp_url, set_as_current=False)
    sender.conf.task_serializer = "json"
    with sender.connection_for_write() as conn, sender.producer_or_acquire() as producer:
        for index in range(count):
            shard = index % SHARDS
            sender.send_task(
                "punctual.poll",
                kwargs={"shard": shard},
                queue=f"shard-{shard:02d}",
                producer=producer,
                connection=conn,
            )


def _wait_count(port: int, name: str, expected: float, proc: Proc, timeout_s: float = 60) -> float:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = _sample(_scrape(port), name)
        if seen >= expected:
            return seen
        time.sleep(0.3)
    raise AssertionError(f"{name} = {seen}, expected {expected}:\n{proc.tail()}")


def test_one_port_counts_the_work_of_every_child(env, amqp_url, tmp_path):
    port = _free_port()
    metrics_dir = tmp_path / "prom"
    # The operator's own PROMETHEUS_MULTIPROC_DIR, so the test can see which children wrote.
    worker = _worker(env, tmp_path, "metrics-a", port, {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    try:
        wait_ready(worker, 2.0)
        before = _sample(_wait_serving(worker, port), "punctual_claim_batch_size_count")
        sent = 0
        writers: set[str] = set()
        deadline = time.monotonic() + 60
        # Polls go to whichever child is free; keep sending until two children have run some.
        while len(writers) < 2 and time.monotonic() < deadline:
            _send_polls(amqp_url, 20)
            sent += 20
            _wait_count(port, "punctual_claim_batch_size_count", before + sent, worker)
            writers = {
                re.sub(r"^histogram_(\d+)\.db$", r"\1", p.name) for p in metrics_dir.glob("histogram_*.db")
            }
        assert len(writers) >= 2, f"only {writers} ran polls"
        scraped = _scrape(port)
        total = _sample(scraped, "punctual_claim_batch_size_count")
        assert total == before + sent  # every child's polls, each once
        # The polls per shard, which the "shard not polled" alert reads: one per tick.
        assert _sample(scraped, "punctual_polls_total") == total
        assert re.search(r'^punctual_polls_total\{shard="0"\} ', scraped, re.M)
    finally:
        worker.stop()


def test_two_workers_on_one_host_serve_two_ports_and_their_own_counts(env, amqp_url, tmp_path):
    port_a, port_b = _free_port(), _free_port()
    worker_a = _worker(env, tmp_path, "metrics-b", port_a)
    worker_b = _worker(env, tmp_path, "metrics-c", port_b)
    try:
        wait_ready(worker_a, 1.0)
        wait_ready(worker_b, 1.0)
        _wait_serving(worker_a, port_a)
        _wait_serving(worker_b, port_b)
        _send_polls(amqp_url, 30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            a = _sample(_scrape(port_a), "punctual_claim_batch_size_count")
            b = _sample(_scrape(port_b), "punctual_claim_batch_size_count")
            if a + b >= 30:
                break
            time.sleep(0.3)
        assert a + b == 30, (a, b)  # each worker counts its own children only: no shared files
        for proc in (worker_a, worker_b):
            assert "Address already in use" not in proc.log_path.read_text(errors="replace")
            assert proc.alive()
    finally:
        worker_a.stop()
        worker_b.stop()
