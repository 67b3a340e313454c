"""End to end with one worker and one beat: backfills, the owner switch, the trace
context of every call, and the overlap policies. Times are generous ceilings."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, utcnow

pytestmark = pytest.mark.e2e


def hook(sink, path: str, **target) -> dict:
    return {"type": "webhook", "url": sink.url(path), **target}


def test_a_backfill_runs_each_occurrence_once_with_its_key_paced_by_the_jobs_rate(stack, api, sink):
    job = api.create(
        target=hook(sink, "/backfill", limits={"rate_per_s": 4}),
        schedule={"cron": "* * * * * *", "timezone": "UTC"},
    )
    api.request("POST", f"/jobs/{job['id']}/pause", expect=200)  # its own schedule stays out of the way
    end = utcnow().replace(microsecond=0) - timedelta(seconds=1)
    start = end - timedelta(seconds=11)
    done = api.request(
        "POST",
        f"/jobs/{job['id']}/backfill",
        {"start": format_instant(start), "end": format_instant(end)},
        expect=202,
    )
    assert done["count"] == 12

    calls = sink.wait_for(12, "/backfill", timeout_s=30)
    occurrences = [format_instant(start + timedelta(seconds=s)) for s in range(12)]
    assert sorted(call.header("Idempotency-Key") for call in calls) == [
        f"{job['id']}:{at}" for at in occurrences
    ]
    # A rate of 4/s with a second of burst: twelve starts take at least two seconds.
    assert max(call.at for call in calls) - min(call.at for call in calls) >= 1.5
    runs = api.wait_runs(job["id"], lambda h: len(h) == 12 and all(r["state"] == "succeeded" for r in h))
    assert {run["origin"] for run in runs} == {"backfill"}
    assert api.job(job["id"])["state"] == "paused"
