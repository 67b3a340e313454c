"""Runs claimed ahead wait on the worker's timers (the design's hybrid), end to end.

Two one-offs on one shard, due HOLD_SPAN apart less a little, are claimed in one
poll and travel in one message, which a worker starts START_LEAD before the first
instant: the second run is then `running` on a timer of the worker's event loop,
not yet called. It is called at its instant, never before; and a worker killed
while it holds it loses nothing (the run's lease brings it back).
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, utcnow
from app.lifecycle.message import HOLD_SPAN
from app.registry.engines import registry_for
from tests.e2e.conftest import make_env
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.rows import runs_of

pytestmark = pytest.mark.e2e

LATER = HOLD_SPAN - timedelta(milliseconds=100)  # the second run shares the first's hold


@pytest.fixture(scope="module")
def pg_shards() -> int:
    """One logical shard: both jobs are claimed by one poll, into one message."""
    return 1


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix) -> dict[str, str]:
    return make_env(pg_dsns[:1], amqp_url, module_redis_prefix, PUNCTUAL_SHARDS="1")


def _two_jobs(api, sink, name: str):
    """Jobs due at `due` and `due + LATER`, written in one request inside the claim-ahead window."""
    due = (utcnow() + timedelta(seconds=4)).replace(microsecond=0)
    bodies = [
        {
            "name": f"{name}-{n}",
            "target": {"type": "webhook", "url": sink.url(f"/{name}/{n}")},
            "schedule": {"run_at": format_instant(at)},
        }
        for n, at in enumerate((due, due + LATER))
    ]
    answer = api.request("POST", "/jobs/batch", {"jobs": bodies}, expect=200)
    return due, [item["job"] for item in answer["items"]]


def _wait_held(registry, sink, job: dict, path: str, due) -> None:
    """Until the job's run is started (its row `running`) and not called: on a timer."""
    while True:
        rows = runs_of(registry, uuid.UUID(job["id"]))
        if rows and rows[0]["state"] == "running":
            assert sink.calls(path) == [], "called before it was seen held"
            return
        assert utcnow() < due, "the run was not started ahead of its instant"
        time.sleep(0.02)


def test_a_run_held_on_a_timer_is_called_at_its_instant_not_before(stack_env, settings, logs, sink, api):
    worker = start_worker(stack_env, logs, name="timers")
    beat = start_beat(stack_env, logs)
    try:
        wait_ready(worker, 1.0)
        due, (first, second) = _two_jobs(api, sink, "on-time")
        _wait_held(registry_for(settings), sink, second, "/on-time/1", due + LATER)
        for n, (job, at) in enumerate(((first, due), (second, due + LATER))):
            [call] = sink.wait_for(1, f"/on-time/{n}", timeout_s=30)
            assert call.at >= at.timestamp(), f"job {n} called before its instant"
            assert call.header("Punctual-Attempt") == "1"
            [run] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
            assert run["lateness_ms"] >= 0
        time.sleep(0.5)
        assert len(sink.calls("/on-time/0")) == len(sink.calls("/on-time/1")) == 1
    finally:
        beat.stop()
        worker.stop()


def test_a_worker_killed_while_it_holds_runs_on_timers_loses_none(stack_env, settings, logs, sink, api):
    holder = start_worker(stack_env, logs, name="holder")
    beat = start_beat(stack_env, logs)
    heir = None
    try:
        wait_ready(holder, 1.0)
        due, jobs = _two_jobs(api, sink, "killed")
        _wait_held(registry_for(settings), sink, jobs[1], "/killed/1", due + LATER)
        holder.kill()
        heir = start_worker(stack_env, logs, name="heir")
        # Started and not called, the run comes back once its lease passed (the janitor).
        for n, (job, at) in enumerate(zip(jobs, (due, due + LATER), strict=True)):
            calls = sink.wait_for(1, f"/killed/{n}", timeout_s=60)
            assert min(call.at for call in calls) >= at.timestamp(), f"job {n} called before its instant"
            api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded", timeout_s=60)
    finally:
        beat.stop()
        for proc in (holder, heir):
            if proc is not None:
                proc.stop()
