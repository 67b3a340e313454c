"""The dispatcher in-process on real Postgres and Redis, calling a local HTTP sink."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, utcnow
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.worker.context import WorkerContext
from punctual_client.signature import verify_signature
from tests.rows import insert_jobs, job, job_row, runs_of, webhook_target
from tests.sink import Answer, Sink

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    server = Sink()
    yield server
    server.close()


@pytest.fixture
def env(pg_settings, truncate, sink):
    truncate()
    settings = dataclasses.replace(
        pg_settings, lease_s=3.0, heartbeat_s=0.5, dispatch_threads=400, target_max_concurrency=1000
    )
    registry = registry_for(settings)
    secret = create_key(registry, "tests").signing_secret
    context = WorkerContext(settings)
    yield context, registry, secret
    context.close(5)


def claim_all(registry, rows) -> list:
    insert_jobs(registry, rows)
    found = []
    for shard in sorted({r["shard"] for r in rows}):
        found += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    return found


def wait_until(predicate, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def test_a_batch_is_called_once_each_with_every_header_and_recorded(env, sink):
    context, registry, secret = env
    rows = [
        job_row(
            16,
            run_at=utcnow() - timedelta(seconds=1),
            target=webhook_target(sink.url(f"/j{i}"), headers={"X-Team": "billing"}),
        )
        for i in range(50)
    ]
    runs = claim_all(registry, rows)
    report = context.dispatcher.dispatch(runs)
    assert report.started == 50
    calls = sink.wait_for(50)
    for row in rows[:5]:
        [call] = sink.calls(row["target"]["url"].removeprefix(sink.base_url))
        key = f"{row['job_id']}:{format_instant(row['nominal_at'])}"
        assert call.header("Idempotency-Key") == key
        assert call.header("Punctual-Job-Id") == str(row["job_id"])
        assert call.header("Punctual-Scheduled-For") == format_instant(row["nominal_at"])
        assert call.header("Punctual-Attempt") == "1" and call.header("X-Team") == "billing"
        assert call.header("Content-Type") == "application/json"
        verify_signature(secret, call.header("Punctual-Signature"), call.body)
    assert len(calls) == 50
    wait_until(lambda: all(job(registry, r["job_id"])["state"] == "completed" for r in rows))
    [run] = runs_of(registry, rows[0]["job_id"])
    assert run["state"] == "succeeded" and run["status_code"] == 200 and run["lateness_ms"] >= 1000


def test_during_a_rotation_window_calls_are_signed_with_the_new_and_the_old_secret(env, sink):
    from app.services.owners import rotate_secret

    context, registry, old = env
    new = rotate_secret(registry, "tests", 3600, utcnow()).signing_secret
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/rotated")))]
    assert context.dispatcher.dispatch(claim_all(registry, rows)).started == 1
    [call] = sink.wait_for(1)
    header = call.header("Punctual-Signature")
    assert header.count("v1=") == 2
    verify_signature(new, header, call.body)
    verify_signature(old, header, call.body)
    assert header.split(",")[1] != header.split(",")[2]


def test_a_duplicated_message_causes_no_second_call(env, sink):
    """Invariants 3 and 4: starting is fenced, so a redelivery only costs work."""
    context, registry, _ = env
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/dup")))
        for _ in range(20)
    ]
    runs = claim_all(registry, rows)
    assert context.dispatcher.dispatch(runs).started == 20
    again = context.dispatcher.dispatch(runs)
    assert again.started == 0 and again.stale == 20
    wait_until(lambda: all(job(registry, r["job_id"])["state"] == "completed" for r in rows))
    assert len(sink.calls("/dup")) == 20


def test_pausing_a_job_claimed_ahead_takes_its_run_back(env, sink):
    """A run claimed ahead has not started: pausing before its instant means no call."""
    from app.services.jobs import pause_job, resume_job

    context, registry, _ = env
    row = job_row(16, run_at=utcnow() + timedelta(seconds=5), target=webhook_target(sink.url("/paused")))
    [run] = claim_all(registry, [row])
    assert run.fire_at == row["next_run_at"]

    paused = pause_job(registry, "tests", str(row["job_id"]), utcnow())

    assert paused["state"] == "paused" and paused["lease_token"] is None
    assert paused["next_run_at"] == row["next_run_at"] and runs_of(registry, row["job_id"]) == []
    report = context.dispatcher.dispatch([run])  # its message arrives anyway
    assert report.started == 0 and report.stale == 1
    assert resume_job(registry, "tests", str(row["job_id"]), utcnow())["state"] == "scheduled"
    [again] = claim_batch(
        registry.engine_for_shard(row["shard"]), row["shard"], utcnow(), registry.settings
    ).runs
    assert again.job_id == row["job_id"] and again.lease_token != run.lease_token and again.attempt == 1
    time.sleep(0.5)
    assert sink.calls("/paused") == []


def test_pausing_a_started_run_lets_it_finish(env, sink):
    from app.services.jobs import pause_job

    context, registry, _ = env
    sink.script("/slow-pause", [Answer(200, delay_s=1.0)])
    row = job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/slow-pause")))
    [run] = claim_all(registry, [row])
    assert context.dispatcher.dispatch([run]).started == 1

    paused = pause_job(registry, "tests", str(row["job_id"]), utcnow())

    assert paused["state"] == "paused" and paused["lease_token"] == run.lease_token
    sink.wait_for(1)
    wait_until(lambda: runs_of(registry, row["job_id"])[0]["state"] == "succeeded")
    assert job(registry, row["job_id"])["state"] == "completed"  # a one-off's end ends a paused job


def test_a_patch_before_the_instant_applies_to_the_run_claimed_ahead(env, sink):
    from app.services.jobs import patch_job

    context, registry, _ = env
    row = job_row(16, run_at=utcnow() + timedelta(seconds=5), target=webhook_target(sink.url("/old")))
    [run] = claim_all(registry, [row])

    patched = patch_job(
        registry,
        "tests",
        str(row["job_id"]),
        {"target": {"type": "webhook", "url": sink.url("/new")}},
        utcnow(),
    )

    assert patched["state"] == "scheduled" and patched["lease_token"] is None
    assert context.dispatcher.dispatch([run]).stale == 1
    [again] = claim_batch(
        registry.engine_for_shard(row["shard"]), row["shard"], utcnow(), registry.settings
    ).runs
    assert again.target["url"] == sink.url("/new")
    # A rename changes nothing a run carries: the claim stands.
    renamed = patch_job(registry, "tests", str(row["job_id"]), {"name": "renamed"}, utcnow())
    assert renamed["lease_token"] == again.lease_token and renamed["state"] == "running"


def test_hundreds_of_calls_are_in_flight_in_one_process(env, sink):
    context, registry, _ = env
    sink.script("/slow", [Answer(200, delay_s=1.0)])
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/slow")))
        for _ in range(300)
    ]
    runs = claim_all(registry, rows)
    began = time.monotonic()
    context.dispatcher.dispatch(runs)
    sink.wait_for(300, "/slow", timeout_s=30)
    wait_until(lambda: context.dispatcher.in_flight() == 0, timeout_s=30)
    assert time.monotonic() - began < 15  # serially it would take 300 s


def test_heartbeats_extend_the_lease_while_a_call_is_in_flight(env, sink):
    context, registry, _ = env
    sink.script("/held", [Answer(200, delay_s=-1)])  # answers when released
    [row] = rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/held")))
    ]
    runs = claim_all(registry, rows)
    context.dispatcher.dispatch(runs)
    sink.wait_for(1, "/held")
    # The start gave the run row a lease of now + lease_s (the claim's queued lease, on
    # the job, is longer); only heartbeats move it on from there while the call is held.
    started_lease = runs_of(registry, row["job_id"])[0]["leased_until"]
    wait_until(
        lambda: runs_of(registry, row["job_id"])[0]["leased_until"] > started_lease + timedelta(seconds=1)
    )
    sink.release.set()
    wait_until(lambda: job(registry, row["job_id"])["state"] == "completed")


def test_a_rate_limit_holds_runs_without_spending_an_attempt(env, sink):
    context, registry, _ = env
    target = webhook_target(sink.url("/limited"), limits={"key": "slow-api", "rate_per_s": 5})
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1), target=target) for _ in range(20)]
    runs = claim_all(registry, rows)
    report = context.dispatcher.dispatch(runs)
    assert report.started == 5 and report.held == 15
    held = [job(registry, r["job_id"]) for r in rows]
    waiting = [j for j in held if j["state"] == "scheduled"]
    assert len(waiting) == 15
    assert all(j["attempt"] == 0 and j["misfire_exempt"] and j["lease_token"] is None for j in waiting)
    assert all(runs_of(registry, j["job_id"]) == [] for j in waiting)  # no attempt recorded
    retry_times = sorted(j["next_run_at"] for j in waiting)
    assert retry_times[-1] - retry_times[0] >= timedelta(seconds=2)  # spread at the rate, not all at once
    sink.wait_for(5, "/limited")


def test_a_failed_call_is_settled_with_its_retry(env, sink):
    context, registry, _ = env
    sink.script("/fail", [Answer(503, headers={"Retry-After": "2"})])
    [row] = rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/fail")))
    ]
    context.dispatcher.dispatch(claim_all(registry, rows))
    after = wait_until(lambda: (j := job(registry, row["job_id"]))["state"] == "scheduled" and j)
    assert after["attempt"] == 1 and after["misfire_exempt"]
    [run] = runs_of(registry, row["job_id"])
    assert run["state"] == "failed" and run["status_code"] == 503
    assert timedelta(seconds=1.5) < after["next_run_at"] - run["finished_at"] <= timedelta(seconds=2.1)


def test_the_worker_path_runs_on_sqlite(tmp_path, sink):
    """Embedded mode (`punctual dev`): claim, start, call, complete, retry on the SQLite file."""
    from app.registry.migrate import migrate_all
    from app.settings import Settings

    dsn = f"sqlite:///{tmp_path / 'registry.sqlite3'}"
    migrate_all((dsn,), shards=1)
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": dsn,
            "PUNCTUAL_SHARDS": "1",
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DATA_DIR": str(tmp_path),
        }
    )
    registry = registry_for(settings)
    create_key(registry, "tests")
    sink.script("/lite-retry", [Answer(500), Answer(200)])
    rows = [
        job_row(1, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/lite"))),
        job_row(
            1,
            run_at=utcnow() - timedelta(seconds=1),
            target=webhook_target(sink.url("/lite-retry")),
            backoff_s=0.01,
        ),
    ]
    context = WorkerContext(settings)
    try:
        assert context.dispatcher.dispatch(claim_all(registry, rows)).started == 2
        wait_until(lambda: job(registry, rows[0]["job_id"])["state"] == "completed")
        retried = wait_until(lambda: (j := job(registry, rows[1]["job_id"]))["attempt"] == 1 and j)
        assert retried["state"] == "scheduled" and retried["misfire_exempt"]
        assert [r["state"] for r in runs_of(registry, rows[1]["job_id"])] == ["failed"]
    finally:
        context.close(5)
        registry.dispose()


def test_runs_started_ahead_wait_for_their_instants_without_taking_call_slots(pg_settings, truncate, sink):
    """A message whose runs fire later than now is started at once, more runs than the
    process has call slots, and each is called at its instant, never before."""
    truncate()
    settings = dataclasses.replace(pg_settings, lease_s=5.0, heartbeat_s=1.0, dispatch_threads=2)
    registry = registry_for(settings)
    create_key(registry, "tests")
    context = WorkerContext(settings)
    try:
        fire = utcnow() + timedelta(seconds=2)
        rows = [
            job_row(
                16, run_at=fire + timedelta(milliseconds=100 * i), target=webhook_target(sink.url(f"/a{i}"))
            )
            for i in range(6)
        ]
        insert_jobs(registry, rows)
        runs = []
        for shard in sorted({r["shard"] for r in rows}):
            claimed = claim_batch(
                registry.engine_for_shard(shard),
                shard,
                utcnow(),
                dataclasses.replace(settings, claim_ahead_s=10),
            )
            runs += claimed.runs
        assert len(runs) == 6 and all(run.fire_at is not None for run in runs)
        report = context.dispatcher.dispatch(runs)  # 6 runs ahead, 2 call slots: not blocked
        assert report.started == 6
        assert utcnow() < fire and sink.calls() == [], "the dispatch waited for the calls' slots"
        sink.wait_for(6)
        for row in rows:
            [call] = sink.calls(row["target"]["url"].removeprefix(sink.base_url))
            assert call.at >= row["next_run_at"].timestamp()
    finally:
        context.close(5)


def test_runs_due_while_every_call_slot_is_taken_get_the_freed_slots_owners_in_turns(
    pg_settings, truncate, sink
):
    """Held runs whose instant comes while every call slot of the process is taken wait
    for one in turns by owner: an owner whose run comes due in the middle of another
    owner's burst is called with the next slot freed, not after the burst."""
    truncate()
    settings = dataclasses.replace(pg_settings, lease_s=10.0, heartbeat_s=1.0, dispatch_threads=2)
    registry = registry_for(settings)
    for owner in ("a", "b"):
        create_key(registry, owner)
    context = WorkerContext(settings)
    try:
        fire = utcnow() + timedelta(seconds=2)
        burst = [
            job_row(16, owner="a", run_at=fire, target=webhook_target(sink.url(f"/a{i}"))) for i in range(8)
        ]
        late = job_row(
            16, owner="b", run_at=fire + timedelta(milliseconds=100), target=webhook_target(sink.url("/b"))
        )
        for i in range(8):
            sink.script(f"/a{i}", [Answer(delay_s=0.4)])
        insert_jobs(registry, [*burst, late])
        runs = []
        for shard in sorted({r["shard"] for r in [*burst, late]}):
            runs += claim_batch(
                registry.engine_for_shard(shard),
                shard,
                utcnow(),
                dataclasses.replace(settings, claim_ahead_s=10),
            ).runs
        assert len(runs) == 9 and all(run.fire_at is not None for run in runs)
        assert context.dispatcher.dispatch(runs).started == 9
        calls = sink.wait_for(9)
        order = [call.path for call in sorted(calls, key=lambda call: call.at)]
        # Two of A's at the instant, then the slots freed 0.4 s on: one to A (served
        # first, level with B), one to B. First come first served made B's the last.
        assert order.index("/b") <= 3, order
    finally:
        context.close(5)
        registry.dispose()
