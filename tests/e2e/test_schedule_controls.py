"""End to end with one worker and one beat: backfills, the owner switch, the trace
context of every call, and the overlap policies. Times are generous ceilings.

The processes export their spans (OTEL_EXPORTER_OTLP_ENDPOINT) to a receiver in the
test process, so every test here also runs with tracing on."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, utcnow
from tests.e2e.conftest import make_env
from tests.otlp_receiver import OtlpReceiver
from tests.sink import Answer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def otlp():
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix, otlp):
    return make_env(
        pg_dsns,
        amqp_url,
        module_redis_prefix,
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="200",  # ms: the spans reach the receiver within the test
        OTEL_SERVICE_NAME="punctual-e2e",
    )


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


def test_a_paused_owner_starts_nothing_its_run_in_flight_finishes_and_the_resume_lets_all_go(
    stack, settings, sink
):
    import time

    from app.registry.engines import registry_for
    from app.services.owners import pause_owner, resume_owner
    from tests.e2e.conftest import Api

    owner = Api(settings, owner="switched")
    sink.script("/switched", [Answer(200, delay_s=3.0), Answer(200)])
    start_at = utcnow().replace(microsecond=0) + timedelta(seconds=2)
    job = owner.create(
        target=hook(sink, "/switched"),
        schedule={"interval_s": 1, "start_at": format_instant(start_at)},
    )
    sink.wait_for(1, "/switched", timeout_s=15)  # the first call, in flight for 3 s

    paused = pause_owner(registry_for(settings), "switched")  # returns once every poller knows
    assert paused.owner == "switched"
    owner.request("POST", f"/jobs/{job['id']}/trigger", expect=202)  # accepted, held
    in_flight = owner.wait_runs(job["id"], lambda h: h and h[0]["state"] == "succeeded", timeout_s=15)
    assert in_flight[0]["attempt"] == 1  # the run in flight finished, its completion written
    calls = len(sink.calls("/switched"))
    time.sleep(3)
    assert len(sink.calls("/switched")) == calls  # nothing started while paused

    resume_owner(registry_for(settings), "switched")
    sink.wait_for(calls + 2, "/switched", timeout_s=20)  # the held trigger and the schedule again
    runs = owner.wait_runs(
        job["id"], lambda h: any(r["origin"] == "trigger" and r["state"] == "succeeded" for r in h)
    )
    missed = [r for r in runs if r["state"] == "skipped"]
    # The occurrences due while paused: run_once ran the latest, the others are recorded.
    assert missed and all("(run_once)" in r["error"] for r in missed)
    owner.request("DELETE", f"/jobs/{job['id']}", expect=200)


def test_each_call_carries_its_runs_trace_and_the_worker_exports_claim_dispatch_and_call(
    stack, api, sink, otlp
):
    due = utcnow().replace(microsecond=0) + timedelta(seconds=2)
    job = api.create(target=hook(sink, "/traced"), schedule={"run_at": format_instant(due)})
    [call] = sink.wait_for(1, "/traced", timeout_s=15)
    [run] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
    trace_id = run["id"].replace("-", "")
    version, traced, parent, flags = call.header("traceparent").split("-")
    assert (version, traced, flags) == ("00", trace_id, "01")  # the run id, read from the header

    spans = otlp.wait_for(trace_id, {"punctual.claim", "punctual.dispatch", "punctual.call"})
    assert spans["punctual.claim"].parent_span_id == ""
    assert spans["punctual.dispatch"].parent_span_id == spans["punctual.claim"].span_id
    assert spans["punctual.call"].parent_span_id == spans["punctual.dispatch"].span_id
    assert spans["punctual.call"].span_id == parent  # what the target got is the call's span
    assert spans["punctual.call"].attributes["http.response.status_code"] == 200
    assert spans["punctual.claim"].attributes["punctual.job_id"] == job["id"]


def test_the_overlap_policies_with_calls_slower_than_the_schedule(stack, api, sink):
    """Every second, each call 2.5 s: `allow` runs each occurrence on time, side by side;
    `skip` and `buffer_one` never overlap, skip recording what fell due meanwhile and
    buffer_one running the latest of it as soon as the run ends."""
    import time

    from app.core.overlap import IN_FLIGHT

    call_s = 2.5
    start_at = utcnow().replace(microsecond=0) + timedelta(seconds=2)
    made = {}
    for overlap in ("allow", "skip", "buffer_one"):
        sink.script(f"/overlap-{overlap}", [Answer(200, delay_s=call_s)])
        made[overlap] = api.create(
            target=hook(sink, f"/overlap-{overlap}"),
            schedule={"interval_s": 1, "start_at": format_instant(start_at)},
            overlap=overlap,
        )
    time.sleep(max(0.0, (start_at - utcnow()).total_seconds()) + 7)
    for job in made.values():
        api.request("DELETE", f"/jobs/{job['id']}", expect=200)
    calls = {overlap: sorted(c.at for c in sink.calls(f"/overlap-{overlap}")) for overlap in made}

    def most_in_flight(times: list[float]) -> int:
        return max(sum(1 for t in times if t <= at < t + call_s) for at in times)

    assert len(calls["allow"]) >= 4 and most_in_flight(calls["allow"]) >= 2
    keys = [c.header("Idempotency-Key") for c in sink.calls("/overlap-allow")]
    assert len(set(keys)) == len(keys)  # one run per occurrence, each its own key
    for overlap in ("skip", "buffer_one"):
        assert len(calls[overlap]) >= 2 and most_in_flight(calls[overlap]) == 1, (overlap, calls[overlap])

    def skipped(overlap: str) -> list[str]:
        runs = api.wait_runs(
            made[overlap]["id"], lambda h: all(r["state"] not in ("claimed", "running") for r in h)
        )
        return [r["error"] for r in runs if r["state"] == "skipped"]

    # (A claim that came late on a busy box may also supersede an occurrence: run_once.)
    assert IN_FLIGHT in skipped("skip")
    assert skipped("buffer_one") and all("(run_once)" in error for error in skipped("buffer_one"))
    assert IN_FLIGHT not in skipped("allow") + skipped("buffer_one")
