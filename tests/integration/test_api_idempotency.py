"""Idempotent create under real concurrency: 20 identical requests, exactly one job."""

from __future__ import annotations

import threading
import uuid

import pytest
import requests
import sqlalchemy as sa

from app.registry.engines import registry_for
from app.registry.schema import jobs
from tests.integration.api_fixtures import job_body

pytestmark = pytest.mark.integration


def test_20_concurrent_identical_creates_make_exactly_one_job(live_server, alice, api_settings):
    key = f"concurrent-{uuid.uuid4()}"
    barrier = threading.Barrier(20)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def create():
        session = requests.Session()
        barrier.wait()
        response = session.post(
            f"{live_server}/jobs",
            json=job_body(name="once"),
            headers={"Authorization": f"Bearer {alice.api_key}", "Idempotency-Key": key},
            timeout=30,
        )
        with lock:
            answers.append((response.status_code, response.json().get("id")))

    threads = [threading.Thread(target=create) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 19 + [201]
    assert len({job_id for _, job_id in answers}) == 1
    total = 0
    for engine in registry_for(api_settings).engines:
        with engine.connect() as conn:
            total += conn.execute(
                sa.select(sa.func.count()).select_from(jobs).where(jobs.c.owner == alice.owner)
            ).scalar_one()
    assert total == 1


def test_20_concurrent_creates_with_different_bodies_make_one_job_and_19_conflicts(live_server, alice):
    key = f"racing-{uuid.uuid4()}"
    barrier = threading.Barrier(20)
    statuses: list[int] = []

    def create(i: int):
        barrier.wait()
        response = requests.post(
            f"{live_server}/jobs",
            json=job_body(name=f"racer-{i}"),
            headers={"Authorization": f"Bearer {alice.api_key}", "Idempotency-Key": key},
            timeout=30,
        )
        statuses.append(response.status_code)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [201] + [409] * 19
