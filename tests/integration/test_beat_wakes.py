"""Every write that can make a row due is seen by beat's read (app.beat.gate), so a
poll goes to its shard: the real API on real Postgres, then the read beat makes.

Each case starts from a job whose shard has nothing to do (so the assertion after
the write can fail), makes the write, and asks the gate what beat would send.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.beat.gate import wants_poll
from app.beat.scheduler import read_work
from app.core.timefmt import format_instant, utcnow
from app.pollers import janitor
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.registry.schema import jobs, runs
from app.services.owners import pause_owner, resume_owner
from tests.integration.api_fixtures import WEBHOOK, engine_of, insert_run, job_row, new_caller

pytestmark = pytest.mark.integration


@pytest.fixture
def caller(api_app, api_settings, truncate):
    truncate()
    return new_caller(api_app, api_settings)


def later() -> dict:
    return {"run_at": format_instant(utcnow() + timedelta(days=1))}


def now() -> dict:
    return {"run_at": format_instant(utcnow())}


def body(schedule: dict, **extra) -> dict:
    return {"name": "wake", "target": dict(WEBHOOK), "schedule": schedule, **extra}


def polled(settings, shard: int) -> bool:
    return wants_poll(read_work(registry_for(settings))[shard], utcnow(), settings.claim_ahead_s)


def shard_of(settings, job_id) -> int:
    return job_row(settings, engine_of(settings, job_id)[1])["shard"]


def created_for_now(c, settings):
    return c.post("/jobs", json=body(now())).get_json()["id"]


def batch_for_now(c, settings):
    return c.post("/jobs/batch", json={"jobs": [body(now())]}).get_json()["items"][0]["job"]["id"]


def put_by_key_for_now(c, settings):
    return c.client.put(
        f"/jobs/by-key/wake-{uuid.uuid4().hex[:6]}", json=body(now()), headers=c._headers(None)
    ).get_json()["id"]


def patched_to_now(c, settings):
    job = c.post("/jobs", json=body(later())).get_json()
    assert not polled(settings, shard_of(settings, job["id"]))
    assert c.patch(f"/jobs/{job['id']}", json={"schedule": now()}).status_code == 200
    return job["id"]


def resumed(c, settings):
    job = c.post("/jobs", json=body(now())).get_json()
    assert c.post(f"/jobs/{job['id']}/pause").status_code == 200
    assert not polled(settings, shard_of(settings, job["id"]))
    assert c.post(f"/jobs/{job['id']}/resume").status_code == 200
    return job["id"]


def resumed_by_label(c, settings):
    job = c.post("/jobs", json=body(now(), labels={"wake": "yes"})).get_json()
    assert c.post("/jobs/pause", json={"labels": {"wake": "yes"}}).status_code == 200
    assert not polled(settings, shard_of(settings, job["id"]))
    assert c.post("/jobs/resume", json={"labels": {"wake": "yes"}}).status_code == 200
    return job["id"]


def triggered(c, settings):
    job = c.post("/jobs", json=body(later())).get_json()
    assert not polled(settings, shard_of(settings, job["id"]))
    assert c.post(f"/jobs/{job['id']}/trigger").status_code in (200, 201, 202)
    return job["id"]


def replayed(c, settings):
    job = c.post("/jobs", json=body(later())).get_json()
    dead = insert_run(settings, job)
    assert not polled(settings, shard_of(settings, job["id"]))
    assert c.post(f"/runs/{dead['run_id']}/replay").status_code in (200, 201, 202)
    return job["id"]


def backfilled(c, settings):
    job = c.post("/jobs", json=body({"cron": "0 * * * *"})).get_json()
    assert not polled(settings, shard_of(settings, job["id"]))
    end = utcnow().replace(minute=0, second=0, microsecond=0)
    window = {"start": format_instant(end - timedelta(hours=2)), "end": format_instant(end)}
    assert c.post(f"/jobs/{job['id']}/backfill", json=window).status_code == 202
    return job["id"]


def retried_by_completion(c, settings):
    """A claimed run whose lease passed: the janitor settles it as a failed attempt,
    and the completion makes the job due again for its retry."""
    job = c.post("/jobs", json=body(now())).get_json()
    engine, key = engine_of(settings, job["id"])
    shard = shard_of(settings, job["id"])
    claim_batch(engine, shard, utcnow(), settings)
    with engine.begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.job_id == key).values(published=True))
        conn.execute(
            sa.update(jobs).where(jobs.c.job_id == key).values(leased_until=utcnow() - timedelta(seconds=1))
        )
    assert not polled(settings, shard)
    assert janitor.expire(engine, shard, utcnow(), settings) == 1
    return job["id"]


@pytest.mark.parametrize(
    "write",
    [
        created_for_now,
        batch_for_now,
        put_by_key_for_now,
        patched_to_now,
        resumed,
        resumed_by_label,
        triggered,
        replayed,
        backfilled,
        retried_by_completion,
    ],
)
def test_a_write_that_makes_work_due_gets_its_shard_a_poll(caller, api_settings, write):
    job_id = write(caller, api_settings)
    assert polled(api_settings, shard_of(api_settings, job_id))


def test_a_paused_owners_due_job_is_still_polled_and_after_the_owner_resumes(caller, api_settings):
    job = caller.post("/jobs", json=body(now())).get_json()
    shard = shard_of(api_settings, job["id"])
    registry = registry_for(api_settings)
    pause_owner(registry, caller.owner, settle_s=0)
    assert polled(api_settings, shard)  # the claim skips it; the read does not hide it
    resume_owner(registry, caller.owner)
    assert polled(api_settings, shard)
