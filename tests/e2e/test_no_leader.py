"""Invariant 4 end to end: two beats and two workers polling the same shards fire
2,000 due jobs exactly once each."""

from __future__ import annotations

import collections
import time
import uuid
from datetime import timedelta

import pytest

from app.core.timefmt import utcnow
from app.registry.engines import registry_for
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.rows import insert_jobs, job_row, runs_of, webhook_target

pytestmark = pytest.mark.e2e

JOBS = 2000


def test_two_pollers_and_two_beats_fire_each_job_once(stack_env, settings, logs, sink, api):
    registry = registry_for(settings)
    due = utcnow() + timedelta(seconds=3)
    rows = [
        job_row(settings.shards, owner="e2e", run_at=due, target=webhook_target(sink.url("/once-each")))
        for _ in range(JOBS)
    ]
    insert_jobs(registry, rows)
    procs = [start_worker(stack_env, logs, name=f"w{i}") for i in range(2)]
    procs += [start_beat(stack_env, logs, name=f"beat{i}") for i in range(2)]
    try:
        for proc in procs:
            wait_ready(proc, 0.5)
        sink.wait_for(JOBS, "/once-each", timeout_s=90)
        time.sleep(3)  # room for any double fire to show up
        keys = collections.Counter(c.header("Idempotency-Key") for c in sink.calls("/once-each"))
        doubled = [k for k, n in keys.items() if n > 1]
        detail = []
        if doubled:  # say which runs the doubled key had, to tell a lease expiry from a double claim
            job_id = uuid.UUID(doubled[0].split(":", 1)[0])
            detail = [
                (r["attempt"], r["state"], r["error"], r["started_at"]) for r in runs_of(registry, job_id)
            ]
        assert len(keys) == JOBS and not doubled, (len(doubled), detail)
        assert {k.split(":", 1)[0] for k in keys} == {str(r["job_id"]) for r in rows}
    finally:
        for proc in procs:
            proc.stop()
