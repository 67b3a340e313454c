"""Limits in the worker engine on real Postgres and Redis: a cap bounds calls in
flight (and the next run starts when one ends), held runs spend no attempt, a run
waiting behind a cap keeps its lease, a rate holds a run once.

The dispatch starts every run its rates admit and returns; the calls take their
concurrency slots on the loop (app.worker.slot_wait), so what a cap does is seen at
the sink and in the registry, not in the dispatch's report."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest

from app import metrics
from app.core.timefmt import utcnow
from app.limits import limit_specs
from app.limits.line import Turn
from app.pollers.claim import claim_batch
from app.pollers.janitor import expire
from app.registry.engines import registry_for
from app.services.owners import create_key, set_weight
from app.worker.context import WorkerContext
from tests.rows import insert_jobs, job, job_row, runs_of, webhook_target
from tests.sink import Answer, Sink

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    server = Sink()
    yield server
    server.close()


def make_env(pg_settings, truncate, **overrides):
    truncate()
    overrides = {"heartbeat_s": 0.5, "target_max_concurrency": 0, **overrides}
    settings = dataclasses.replace(pg_settings, **overrides)
    registry = registry_for(settings)
    create_key(registry, "tests")
    return WorkerContext(settings), registry


@pytest.fixture
def contexts():
    made = []
    yield made
    for context in made:
        context.close(10)


def due_now(registry, rows) -> None:
    insert_jobs(registry, rows)


def claim_due(registry) -> list:
    found = []
    for shard in range(registry.settings.shards):
        found += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    return found


def capped(sink, path: str, cap: int, **limits) -> dict:
    return webhook_target(sink.url(path), limits={"key": path, "max_concurrency": cap, **limits})


def assert_each_completed_once(registry, rows, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(
        job(registry, r["job_id"])["state"] != "completed" for r in rows
    ):
        time.sleep(0.05)
    assert all(len(runs_of(registry, r["job_id"])) == 1 for r in rows)


def assert_every_slot_back(context, target: dict, cap: int, timeout_s: float = 5) -> None:
    """Every slot of the target's own cap is free in Redis again (the last one goes back
    as its call ends)."""
    [spec] = limit_specs("tests", target, context.settings)
    deadline = time.monotonic() + timeout_s
    while (
        context.limiter.free_slots({spec.key: cap}, utcnow())[spec.key] != cap and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert context.limiter.free_slots({spec.key: cap}, utcnow()) == {spec.key: cap}


def test_a_cap_bounds_calls_in_flight_and_the_next_run_starts_when_one_ends(
    pg_settings, truncate, sink, contexts
):
    """Behind a cap of 2, eight runs of 0.1 s, all in one dispatch: the six that wait
    take the slots of the calls that end, straight (no release and no admission in
    between, and called by the ending call's task), the cap still bounds calls in
    flight, and every slot is back in Redis at the end."""
    context, registry = make_env(pg_settings, truncate, lease_s=30.0)  # waits up to 2 s for a slot
    contexts.append(context)
    call_s = 0.1
    sink.script("/cap2", [Answer(200, delay_s=call_s)])
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=capped(sink, "/cap2", 2)) for _ in range(8)
    ]
    due_now(registry, rows)
    handed_before = metrics.SLOTS_HANDED_OVER._value.get()
    dispatcher = context.dispatcher
    tasks: list = []
    spawn = dispatcher._spawn
    dispatcher._spawn = lambda call: tasks.append(call) or spawn(call)

    report = dispatcher.dispatch(claim_due(registry))

    # Every run started in this dispatch: none was held back, none waited for a schedule.
    assert (report.started, report.held) == (8, 0)
    arrivals = sorted(call.at for call in sink.wait_for(8, "/cap2"))
    # Never more than 2 in flight: the third call arrives only after the first answered.
    assert all(later >= earlier + call_s for earlier, later in zip(arrivals, arrivals[2:], strict=False))
    assert_each_completed_once(registry, rows)
    # (The gate counts the slots it handed over once a second, not one by one.)
    deadline = time.monotonic() + 5
    while metrics.SLOTS_HANDED_OVER._value.get() - handed_before < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics.SLOTS_HANDED_OVER._value.get() - handed_before == 6
    # Each handed run was called by the task of the call that ended: two tasks in all.
    assert len(tasks) == 2
    assert_every_slot_back(context, rows[0]["target"], 2)
    # The history says when each call went out, not when its run was started (all at
    # once): four rounds of two calls, so the last began three calls after the first.
    history = [runs_of(registry, r["job_id"])[0] for r in rows]
    starts = sorted(run["started_at"] for run in history)
    assert starts[-1] - starts[0] >= timedelta(seconds=3 * call_s)
    assert all(
        abs(run["lateness_ms"] - (run["started_at"] - run["scheduled_for"]).total_seconds() * 1000) <= 1
        for run in history
    )


def test_runs_behind_a_small_cap_all_start_within_about_two_seconds(pg_settings, truncate, sink, contexts):
    """80 runs of 50 ms due at once behind a cap of 4: 20 rounds of 50 ms. Each starts
    as a slot frees (none is given a schedule: none goes back to the registry), and
    at no instant are more than 4 calls in flight."""
    context, registry = make_env(pg_settings, truncate, lease_s=30.0)
    contexts.append(context)
    call_s = 0.05
    sink.script("/cap4", [Answer(200, delay_s=call_s)])
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=capped(sink, "/cap4", 4))
        for _ in range(80)
    ]
    due_now(registry, rows)

    report = context.dispatcher.dispatch(claim_due(registry))

    assert (report.started, report.held) == (80, 0)
    arrivals = sorted(call.at for call in sink.wait_for(80, "/cap4", timeout_s=30))
    assert all(later >= earlier + call_s for earlier, later in zip(arrivals, arrivals[4:], strict=False))
    assert_each_completed_once(registry, rows)
    for row in rows:
        [run] = runs_of(registry, row["job_id"])
        assert run["state"] == "succeeded" and run["attempt"] == 1  # none held, none retried


def test_a_run_held_by_a_rate_and_a_cap_at_once_is_held_by_the_rate_and_takes_no_slot(
    pg_settings, truncate, sink, contexts
):
    """A rate of 1/s and a cap of 1: the first run is admitted and holds the slot; the
    other two are held back by the rate before their start, with no slot taken (the
    cap's only slot is the first call's, and comes back when it ends)."""
    context, registry = make_env(pg_settings, truncate, lease_s=30.0, claim_ahead_s=0.0)
    contexts.append(context)
    sink.script("/rated", [Answer(200, delay_s=-1)])  # answers when released
    target = capped(sink, "/rated", 1, rate_per_s=1)
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1), target=target) for _ in range(3)]
    due_now(registry, rows)

    report = context.dispatcher.dispatch(claim_due(registry))

    assert (report.started, report.held) == (1, 2)
    sink.wait_for(1, "/rated")
    [spec] = limit_specs("tests", target, context.settings)
    assert context.limiter.free_slots({spec.key: 1}, utcnow()) == {spec.key: 0}  # the call's
    held = [j for j in (job(registry, r["job_id"]) for r in rows) if j["state"] == "scheduled"]
    assert len(held) == 2 and all(j["attempt"] == 0 for j in held)
    sink.release.set()
    assert_every_slot_back(context, target, 1)


def test_a_withdrawn_calls_slot_goes_back_to_redis_and_never_to_a_waiting_run(
    pg_settings, truncate, sink, contexts
):
    """A call withdrawn at its last look (its lease may be gone) gave its slot back to
    Redis already: handing that name on too would let a run call without a slot."""
    from app.worker.webhook import NotSent

    class Withdrawn:
        def __init__(self):
            self.tries = 0

        async def send(self, call):
            self.tries += 1
            raise NotSent("withdrawn")

        def close(self):
            pass

    context, registry = make_env(pg_settings, truncate, lease_s=30.0)
    contexts.append(context)
    context.dispatcher.webhooks = withdrawn = Withdrawn()
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=capped(sink, "/gone", 1)) for _ in range(3)
    ]
    due_now(registry, rows)
    handed_before = metrics.SLOTS_HANDED_OVER._value.get()
    dispatcher = context.dispatcher
    tasks: list = []
    spawn = dispatcher._spawn
    dispatcher._spawn = lambda call: tasks.append(call) or spawn(call)

    report = dispatcher.dispatch(claim_due(registry))

    assert (report.started, report.held) == (3, 0)
    deadline = time.monotonic() + 10
    while withdrawn.tries < 3 and time.monotonic() < deadline:  # one after the other, each through Redis
        time.sleep(0.02)
    assert withdrawn.tries == 3
    assert metrics.SLOTS_HANDED_OVER._value.get() == handed_before
    assert_every_slot_back(context, rows[0]["target"], 1)


def test_runs_still_waiting_for_a_slot_are_put_off_once_without_spending_an_attempt(
    pg_settings, truncate, sink, contexts
):
    context, registry = make_env(pg_settings, truncate, lease_s=3.0)  # waits up to 0.3 s for a slot
    contexts.append(context)
    sink.script("/cap1", [Answer(200, delay_s=-1)])  # answers when released
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=capped(sink, "/cap1", 1)) for _ in range(3)
    ]
    due_now(registry, rows)
    began = utcnow()

    report = context.dispatcher.dispatch(claim_due(registry))

    assert report.started == 3  # started; two of them wait on the loop for the slot
    sink.wait_for(1, "/cap1")
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and sum(job(registry, r["job_id"])["state"] == "scheduled" for r in rows) < 2
    ):
        time.sleep(0.02)
    waiting = [j for j in (job(registry, r["job_id"]) for r in rows) if j["state"] == "scheduled"]
    assert len(waiting) == 2
    assert all(j["attempt"] == 0 and j["misfire_exempt"] and j["lease_token"] is None for j in waiting)
    assert all(runs_of(registry, j["job_id"]) == [] for j in waiting)  # no attempt recorded
    # Put off past the wait: held after waiting 0.3 s, to when a slot is expected, at
    # least as long again since none came (not compared with the clock after these
    # reads, which a busy box makes take longer than that).
    assert all(j["next_run_at"] >= began + timedelta(seconds=0.55) for j in waiting)
    assert context.dispatcher.in_flight() == 1  # only the call held at the sink
    assert len(sink.calls("/cap1")) == 1
    sink.release.set()


def test_no_lease_expires_while_runs_wait_behind_a_cap_longer_than_the_lease(
    pg_settings, truncate, sink, contexts
):
    """Five 1 s calls behind a cap of 1 take 5 s; the lease is 2 s. The runs wait in the
    worker or in the registry, never holding a lease they cannot keep."""
    context, registry = make_env(pg_settings, truncate, lease_s=2.0, claim_ahead_s=0.0)
    contexts.append(context)
    sink.script("/slow", [Answer(200, delay_s=1.0)])
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=capped(sink, "/slow", 1)) for _ in range(5)
    ]
    due_now(registry, rows)
    expired = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        context.dispatcher.dispatch(claim_due(registry))
        expired += sum(
            expire(registry.engine_for_shard(shard), shard, utcnow(), registry.settings)
            for shard in range(16)
        )
        if all(job(registry, r["job_id"])["state"] == "completed" for r in rows):
            break
        time.sleep(0.1)
    assert expired == 0
    for row in rows:
        [run] = runs_of(registry, row["job_id"])
        assert run["state"] == "succeeded" and run["attempt"] == 1
    assert len(sink.calls("/slow")) == 5


def test_a_run_held_by_a_rate_starts_at_its_turn_without_a_second_hold(pg_settings, truncate, sink, contexts):
    context, registry = make_env(pg_settings, truncate, lease_s=30.0, claim_ahead_s=0.0)
    contexts.append(context)
    target = webhook_target(sink.url("/rate"), limits={"key": "rate", "rate_per_s": 4})
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1), target=target) for _ in range(12)]
    due_now(registry, rows)
    first = context.dispatcher.dispatch(claim_due(registry))
    assert (first.started, first.held) == (4, 8)
    # Newcomers arrive while the held runs wait for their turns.
    late = [job_row(16, run_at=utcnow(), target=target) for _ in range(4)]
    due_now(registry, late)
    holds = first.held
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report = context.dispatcher.dispatch(claim_due(registry))
        holds += report.held
        if all(job(registry, r["job_id"])["state"] == "completed" for r in rows + late):
            break
        time.sleep(0.02)
    # 8 held at first, 4 newcomers held behind them; none of them held a second time.
    assert holds == 12
    assert len(sink.calls("/rate")) == 16


def test_each_run_takes_its_owners_turn_in_a_caps_line_with_the_owners_weight_and_lane(
    pg_settings, truncate, sink, contexts
):
    context, registry = make_env(pg_settings, truncate, lease_s=30.0, target_max_concurrency=1)
    contexts.append(context)
    create_key(registry, "heavy")
    set_weight(registry, "heavy", 3)
    past = utcnow() - timedelta(seconds=1)
    target = webhook_target(sink.url("/turns"))
    rows = [
        job_row(16, owner="heavy", run_at=past, target=target),
        job_row(16, run_at=past, target=target),
        job_row(16, interval_s=60, first=past, target=target),
    ]
    due_now(registry, rows)
    gate = context.dispatcher._gate
    taken: list = []
    take = gate.take
    gate.take = lambda call, caps, keys, turn: taken.append(turn) or take(call, caps, keys, turn)

    context.dispatcher.dispatch(claim_due(registry))

    sink.wait_for(3, "/turns")
    assert sorted(taken, key=lambda turn: turn.flow) == [
        Turn("heavy", weight=3),
        Turn("tests"),
        Turn("tests", recurring=True),
    ]
