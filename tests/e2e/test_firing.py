"""End to end with one worker and one beat: on time, headers, retries, dead letters,
replay, limits, pause/resume/cancel/trigger, and a poller crash before its
commit. Times are generous ceilings, never exact."""

from __future__ import annotations

import time
from datetime import timedelta
from itertools import pairwise

import pytest

from app.core.timefmt import format_instant, parse_instant, utcnow
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.registry.sharding import shard_for
from punctual_client.signature import verify_signature
from tests.e2e.conftest import make_env
from tests.sink import Answer

pytestmark = pytest.mark.e2e


def free_port_pair() -> int:
    """A port p with p and p + 1 free: the worker's two prefork children serve metrics there."""
    import random
    import socket

    for _ in range(100):
        port = random.randint(20000, 40000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix):
    return make_env(pg_dsns, amqp_url, module_redis_prefix, PUNCTUAL_METRICS_PORT=str(free_port_pair()))


def hook(sink, path: str, **target) -> dict:
    return {"type": "webhook", "url": sink.url(path), **target}


def test_a_one_off_reaches_the_sink_within_2s_of_its_time(stack, api, sink):
    due = (utcnow() + timedelta(seconds=2)).replace(microsecond=0) + timedelta(seconds=1)
    job = api.create(
        target=hook(sink, "/once", headers={"X-Team": "billing"}),
        payload={"n": 1},
        schedule={"run_at": format_instant(due)},
    )
    [call] = sink.wait_for(1, "/once", timeout_s=10)
    assert call.at - due.timestamp() < 2.0
    key = f"{job['id']}:{format_instant(due)}"
    assert call.header("Idempotency-Key") == key
    assert call.header("Punctual-Job-Id") == job["id"]
    assert call.header("Punctual-Scheduled-For") == format_instant(due)
    assert call.header("Punctual-Attempt") == "1"
    assert call.header("Content-Type") == "application/json" and call.header("X-Team") == "billing"
    assert call.body == b'{"n":1}'
    verify_signature(api.secret, call.header("Punctual-Signature"), call.body)
    [run] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
    assert run["attempt"] == 1 and run["scheduled_for"] == format_instant(due) and run["status_code"] == 200
    assert api.job(job["id"])["state"] == "completed"


def test_a_run_claimed_ahead_starts_at_its_instant_never_before(stack, api, sink):
    due = (utcnow() + timedelta(seconds=4)).replace(microsecond=0) + timedelta(seconds=1)
    job = api.create(target=hook(sink, "/ahead"), schedule={"run_at": format_instant(due)})
    # Claimed within a poll interval, seconds before its instant (PUNCTUAL_CLAIM_AHEAD_S) ...
    _wait_for_state(api, job["id"], "running", before=due)
    assert sink.calls("/ahead") == []
    # ... and called at that instant, not at the claim.
    [call] = sink.wait_for(1, "/ahead", timeout_s=10)
    assert call.at >= due.timestamp()
    [run] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
    assert run["lateness_ms"] >= 0


def test_pausing_before_the_instant_stops_a_run_claimed_ahead(stack, api, sink):
    due = (utcnow() + timedelta(seconds=4)).replace(microsecond=0) + timedelta(seconds=1)
    job = api.create(target=hook(sink, "/paused-ahead"), schedule={"run_at": format_instant(due)})
    _wait_for_state(api, job["id"], "running", before=due)
    paused = api.request("POST", f"/jobs/{job['id']}/pause", expect=200)
    assert paused["state"] == "paused" and paused["next_run_at"] == format_instant(due)
    time.sleep(max(0.0, due.timestamp() - time.time()) + 2)
    assert sink.calls("/paused-ahead") == [] and api.runs(job["id"]) == []
    api.request("POST", f"/jobs/{job['id']}/resume", expect=200)  # late now: a one-off still runs
    [call] = sink.wait_for(1, "/paused-ahead", timeout_s=10)
    assert call.header("Punctual-Scheduled-For") == format_instant(due)


def _wait_for_state(api, job_id: str, state: str, before) -> None:
    while api.job(job_id)["state"] != state:
        assert utcnow() < before, f"job {job_id} was not {state} before {before}"
        time.sleep(0.1)


def test_a_6_field_cron_every_2s_fires_on_even_seconds_without_drift(stack, api, sink):
    job = api.create(target=hook(sink, "/cron"), schedule={"cron": "*/2 * * * * *", "timezone": "UTC"})
    calls = sink.wait_for(5, "/cron", timeout_s=20)
    api.request("DELETE", f"/jobs/{job['id']}", expect=200)
    instants = [parse_instant(c.header("Punctual-Scheduled-For")) for c in calls[:5]]
    assert all(i.second % 2 == 0 and i.microsecond == 0 for i in instants)
    assert [(b - a).total_seconds() for a, b in pairwise(instants)] == [2.0] * 4
    for call, instant in zip(calls, instants, strict=False):  # calls may hold more than five
        assert 0 <= call.at - instant.timestamp() < 5.0  # a generous ceiling: this is about drift


def test_500_500_200_is_three_calls_with_one_key_and_backoff(stack, api, sink):
    sink.script("/flaky", [Answer(500), Answer(500), Answer(200)])
    job = api.create(
        target=hook(sink, "/flaky"),
        schedule={"run_at": format_instant(utcnow())},
        retry={"max_attempts": 5, "backoff_s": 1, "max_backoff_s": 10},
    )
    calls = sink.wait_for(3, "/flaky", timeout_s=20)
    assert {c.header("Idempotency-Key") for c in calls} == {f"{job['id']}:{job['next_run_at']}"}
    assert [c.header("Punctual-Attempt") for c in calls] == ["1", "2", "3"]
    # Delay before attempt n+1 is backoff_s x 2^(n-1) x uniform(0.5, 1): at least 0.5 s, then 1 s.
    assert calls[1].at - calls[0].at >= 0.5 and calls[2].at - calls[1].at >= 1.0
    history = api.wait_runs(job["id"], lambda h: len(h) == 3 and h[-1]["state"] == "succeeded")
    assert [(r["attempt"], r["state"], r["status_code"]) for r in history] == [
        (1, "failed", 500),
        (2, "failed", 500),
        (3, "succeeded", 200),
    ]


def test_always_500_goes_dead_and_a_replay_calls_once_more_with_the_same_key(stack, api, sink):
    sink.script("/down", [Answer(500)])
    job = api.create(
        target=hook(sink, "/down"),
        schedule={"run_at": format_instant(utcnow())},
        retry={"max_attempts": 2, "backoff_s": 0.5, "max_backoff_s": 1},
    )
    api.wait_job(job["id"], lambda j: j["state"] == "dead")
    history = api.runs(job["id"])
    assert [(r["attempt"], r["state"]) for r in history] == [(1, "failed"), (2, "dead")]
    dead = api.request("GET", "/dead-letters", expect=200)["items"]
    assert history[-1]["id"] in [d["id"] for d in dead]
    sink.script("/down", [Answer(200)])
    api.request("POST", f"/runs/{history[-1]['id']}/replay", expect=202)
    calls = sink.wait_for(3, "/down", timeout_s=15)
    assert (
        len({c.header("Idempotency-Key") for c in calls}) == 1 and calls[-1].header("Punctual-Attempt") == "1"
    )
    api.wait_job(job["id"], lambda j: j["state"] == "completed")
    time.sleep(1)
    assert len(sink.calls("/down")) == 3


def test_a_400_is_dead_at_once(stack, api, sink):
    sink.script("/bad", [Answer(400)])
    job = api.create(target=hook(sink, "/bad"), schedule={"run_at": format_instant(utcnow())})
    api.wait_job(job["id"], lambda j: j["state"] == "dead")
    [run] = api.runs(job["id"])
    assert run["state"] == "dead" and run["status_code"] == 400 and len(sink.calls("/bad")) == 1


def test_retry_after_is_honoured(stack, api, sink):
    sink.script("/busy", [Answer(503, headers={"Retry-After": "2"}), Answer(200)])
    job = api.create(
        target=hook(sink, "/busy"),
        schedule={"run_at": format_instant(utcnow())},
        retry={"max_attempts": 3, "backoff_s": 300, "max_backoff_s": 600},
    )
    first, second = sink.wait_for(2, "/busy", timeout_s=15)
    assert 2.0 <= second.at - first.at < 15.0  # Retry-After: 2, not the 150-300 s backoff
    api.wait_job(job["id"], lambda j: j["state"] == "completed")


def test_a_poller_that_dies_before_its_commit_loses_nothing(stack, api, sink, settings):
    """Invariant 8: a poller that claimed a job and died publishing it, before its
    COMMIT (a claim publishes first: app.pollers.claim).

    The test plays that poller: it claims the job itself (as of the job's due
    instant, an hour ahead, so the running pollers cannot take it first) and dies in
    its publish. The claim is rolled back: the job is still due, the running system
    claims it when it falls due, and the run succeeds on its first attempt.
    """
    import sqlalchemy as sa

    from app.registry.schema import jobs

    due = utcnow() + timedelta(hours=1)
    job = api.create(target=hook(sink, "/orphan"), schedule={"run_at": format_instant(due)})
    registry = registry_for(settings)
    shard = shard_for(job["id"], settings.shards)
    engine = registry.engine_for_shard(shard)

    def die(shard, messages):
        raise ConnectionError("the poller dies in its publish")

    with pytest.raises(ConnectionError):
        claim_batch(engine, shard, due + timedelta(seconds=1), settings, send=die)
    assert api.job(job["id"])["state"] == "scheduled"
    with engine.begin() as conn:  # due now, for the running pollers
        conn.execute(sa.update(jobs).where(jobs.c.job_id == job["id"]).values(next_run_at=utcnow()))
    [call] = sink.wait_for(1, "/orphan", timeout_s=15)
    assert call.header("Idempotency-Key") == f"{job['id']}:{format_instant(due)}"
    [done] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
    assert done["attempt"] == 1


def test_a_rate_limit_of_5_per_s_spreads_50_due_jobs_over_about_10s(stack, api, sink):
    target = hook(sink, "/limited", limits={"key": "limited-api", "rate_per_s": 5})
    due = format_instant(utcnow() + timedelta(seconds=1))
    jobs = [api.create(target=target, schedule={"run_at": due}) for _ in range(50)]
    calls = sink.wait_for(50, "/limited", timeout_s=30)
    spread = calls[-1].at - calls[0].at
    assert 7.0 <= spread <= 20.0  # 5 at once (one second of burst), then 5/s: about 9 s
    for job in jobs[:10]:
        history = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
        assert [r["attempt"] for r in history] == [1]  # held runs spent no attempt
    windows = {}
    for call in calls:
        windows[int(call.at)] = windows.get(int(call.at), 0) + 1
    assert max(windows.values()) <= 10


def test_pause_cancel_and_trigger_while_a_run_is_in_flight(stack, api, sink):
    sink.script("/slow", [Answer(200, delay_s=1.5)])
    job = api.create(target=hook(sink, "/slow"), schedule={"interval_s": 2})
    sink.wait_for(1, "/slow", timeout_s=10)
    api.request("POST", f"/jobs/{job['id']}/pause", expect=200)  # the call is in flight
    api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded", timeout_s=10)
    assert api.job(job["id"])["state"] == "paused"
    seen = len(sink.calls("/slow"))
    time.sleep(3)
    assert len(sink.calls("/slow")) == seen  # no new run while paused

    api.request("POST", f"/jobs/{job['id']}/trigger", expect=202)  # allowed while paused
    trigger_calls = sink.wait_for(seen + 1, "/slow", timeout_s=10)
    assert api.job(job["id"])["state"] == "paused"
    triggered_key = trigger_calls[-1].header("Idempotency-Key")

    api.request("POST", f"/jobs/{job['id']}/resume", expect=200)
    sink.wait_for(seen + 2, "/slow", timeout_s=10)
    api.request("DELETE", f"/jobs/{job['id']}", expect=200)  # may land while a call is in flight
    time.sleep(2)
    final = api.job(job["id"])
    assert final["state"] == "cancelled"
    settled = len(sink.calls("/slow"))
    time.sleep(3)
    assert len(sink.calls("/slow")) == settled  # no new call after the cancel
    history = api.runs(job["id"])
    assert any(r["scheduled_for"] == triggered_key.split(":", 1)[1] for r in history)
    # Resuming found missed occurrences: run_once ran the latest and recorded the others skipped.
    assert all(r["state"] in ("succeeded", "failed", "skipped") for r in history)


def test_workers_expose_prometheus_metrics(stack, stack_env, api, sink):
    import requests

    api.create(target=hook(sink, "/metered"), schedule={"run_at": format_instant(utcnow())})
    sink.wait_for(1, "/metered", timeout_s=10)
    # One port for the worker, whatever its number of children (tests/integration/test_worker_metrics.py).
    port = int(stack_env["PUNCTUAL_METRICS_PORT"])
    deadline = time.monotonic() + 10
    while True:
        joined = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        if 'punctual_runs_total{outcome="succeeded"}' in joined or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for name in (
        "punctual_claims_total",
        "punctual_runs_total",
        "punctual_start_lateness_seconds_count",
        "punctual_runs_started_total",
        "punctual_claim_batch_size_count",
    ):
        assert name in joined, name
