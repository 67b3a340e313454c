"""Misfire policies end to end, with PUNCTUAL_MISFIRE_GRACE_S=1.

Three jobs on a 6-second grid (occurrences S, S+6, ..., S+24), one per policy, are
created while no beat runs; the beat starts 1.5 s after S+12, so S, S+6 and S+12 are
missed (more than the grace late) and S+18, S+24 come on time (the grid is wide
enough that the new beat's first poll comes well before S+18, even on a busy box):

- run_once: one catch-up run for S+12 (the latest missed), S and S+6 recorded skipped;
- run_all: S, S+6, S+12 run, in order, then S+18 and S+24;
- skip: none of the three runs, all three are recorded skipped; S+18 and S+24 run.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, parse_instant, utcnow
from tests.e2e.conftest import make_env
from tests.e2e.processes import start_beat, start_worker, wait_ready

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix):
    return make_env(pg_dsns, amqp_url, module_redis_prefix, PUNCTUAL_MISFIRE_GRACE_S="1")


def test_misfire_policies_after_the_beat_was_down(stack_env, api, sink, logs):
    worker = start_worker(stack_env, logs)
    beat = None
    try:
        wait_ready(worker, 1.0)
        start = utcnow().replace(microsecond=0) + timedelta(seconds=2)
        jobs = {}
        for policy in ("run_once", "run_all", "skip"):
            jobs[policy] = api.create(
                target={"type": "webhook", "url": sink.url(f"/{policy}")},
                misfire=policy,
                schedule={
                    "interval_s": 6,
                    "start_at": format_instant(start),
                    "end_at": format_instant(start + timedelta(seconds=24)),
                },
            )
        time.sleep(max(0.0, (start + timedelta(seconds=13.5) - utcnow()).total_seconds()))
        beat = start_beat(stack_env, logs)
        for job in jobs.values():
            api.wait_job(job["id"], lambda j: j["state"] == "completed", timeout_s=40)

        def fired(policy):
            return [parse_instant(c.header("Punctual-Scheduled-For")) for c in sink.calls(f"/{policy}")]

        def history(policy):
            return [(parse_instant(r["scheduled_for"]), r["state"]) for r in api.runs(jobs[policy]["id"])]

        at = [start + timedelta(seconds=6 * k) for k in range(5)]
        assert fired("run_once") == [at[2], at[3], at[4]]
        assert sorted(history("run_once")) == [
            (at[0], "skipped"),
            (at[1], "skipped"),
            (at[2], "succeeded"),
            (at[3], "succeeded"),
            (at[4], "succeeded"),
        ]
        assert fired("run_all") == at  # every missed occurrence, oldest first
        assert [s for _, s in history("run_all")] == ["succeeded"] * 5
        assert fired("skip") == [at[3], at[4]]
        assert sorted(history("skip")) == [
            (at[0], "skipped"),
            (at[1], "skipped"),
            (at[2], "skipped"),
            (at[3], "succeeded"),
            (at[4], "succeeded"),
        ]
        # S+18 and S+24 were claimed within the grace: they ran (a little late) under every policy.
        for policy in jobs:
            late = [
                r["lateness_ms"]
                for r in api.runs(jobs[policy]["id"])
                if parse_instant(r["scheduled_for"]) >= at[3]
            ]
            assert late and all(0 <= ms < 3000 for ms in late)  # claimed within the grace; started soon after
    finally:
        if beat is not None:
            beat.stop()
        worker.stop()
