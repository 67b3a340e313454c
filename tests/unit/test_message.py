"""The dispatch message: building, chunking and reading back (pure)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.lifecycle.message import (
    COARSE_ETA_STEP,
    ETA_STEP,
    SPARSE_STEP_RUNS,
    DispatchRun,
    chunks,
    decode_runs,
    encode_runs,
    eta_of,
    message_headers,
    to_messages,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def run(**overrides) -> DispatchRun:
    values = dict(
        run_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        shard=3,
        owner="acme",
        origin="schedule",
        lease_token=uuid.uuid4(),
        scheduled_for=datetime(2026, 12, 1, tzinfo=UTC),
        attempt=2,
        target={"type": "webhook", "url": "https://example.com/hook"},
        retry={"max_attempts": 5},
        payload={"any": ["json", 1]},
    )
    values.update(overrides)
    return DispatchRun(**values)


def test_an_entry_survives_json_both_ways():
    original = run(scheduled_for=datetime(2026, 12, 1, 0, 0, 0, 123000, tzinfo=UTC))
    entry = json.loads(json.dumps(original.to_message()))
    assert entry["scheduled_for"] == "2026-12-01T00:00:00.123Z"
    assert DispatchRun.from_message(entry) == original


def test_a_messages_runs_travel_as_one_json_text_and_a_plain_list_still_reads():
    originals = [run(), run(recurring=True, payload=None), run(fire_at=NOW)]
    entries = [r.to_message() for r in originals]
    text = encode_runs(entries)
    assert isinstance(text, str) and json.loads(text) == entries
    assert [DispatchRun.from_message(e) for e in decode_runs(text)] == originals
    # A message sent before the runs travelled as text: its runs are Celery's own list.
    assert [DispatchRun.from_message(e) for e in decode_runs(json.loads(text))] == originals


def test_a_recurring_run_survives_json_and_a_one_off_carries_no_flag():
    original = run(recurring=True)
    assert DispatchRun.from_message(json.loads(json.dumps(original.to_message()))) == original
    assert "recurring" not in run().to_message()


def test_the_signing_secret_is_never_on_the_broker():
    assert not any("secret" in key for key in run().to_message())


def test_off_schedule_runs_and_the_runs_of_an_allow_job_hold_their_own_lease():
    assert not run().leased_on_run
    assert run(origin="trigger").leased_on_run and run(origin="replay").leased_on_run
    assert run(origin="backfill").leased_on_run
    allowed = run(own_lease=True)
    assert allowed.leased_on_run and allowed.origin == "schedule"
    assert DispatchRun.from_message(allowed.to_message()) == allowed
    assert "own_lease" not in run().to_message()


def test_chunks_are_even_and_keep_the_order():
    items = list(range(501))
    parts = list(chunks(items, 100))
    assert [len(p) for p in parts] == [84, 84, 84, 83, 83, 83]
    assert [x for p in parts for x in p] == items
    assert list(chunks([], 100)) == []
    assert [len(p) for p in chunks(list(range(100)), 100)] == [100]


def test_a_claim_batch_becomes_a_few_messages():
    messages = to_messages([run() for _ in range(500)], NOW)
    assert len(messages) == 5 and all(eta is None and len(m) == 100 for eta, m in messages)


def test_the_fire_instant_of_a_run_claimed_ahead_survives_json():
    original = run(fire_at=NOW + timedelta(seconds=7, milliseconds=250))
    entry = json.loads(json.dumps(original.to_message()))
    assert entry["fire_at"] == "2026-12-01T00:00:07.250Z"
    assert DispatchRun.from_message(entry) == original
    assert "fire_at" not in run().to_message()  # due now: no instant to wait for


@given(st.integers(min_value=1, max_value=300_000_000))
def test_an_eta_is_never_before_the_instant_and_at_most_one_step_after(offset_us):
    fire_at = NOW + timedelta(microseconds=offset_us)
    eta = eta_of(fire_at, NOW)
    assert fire_at <= eta < fire_at + ETA_STEP
    assert (eta - NOW) % ETA_STEP == timedelta(0)


def test_a_run_whose_instant_has_come_goes_at_once():
    assert eta_of(None, NOW) is None
    assert eta_of(NOW, NOW) is None
    assert eta_of(NOW - timedelta(seconds=3), NOW) is None


def test_runs_are_grouped_by_eta_and_the_due_ones_go_first():
    later = NOW + timedelta(seconds=5)
    runs = (
        [run(fire_at=later) for _ in range(150)]
        + [run() for _ in range(3)]
        + [run(fire_at=later - timedelta(milliseconds=30)) for _ in range(2)]  # rounded up to `later`
        + [run(fire_at=later + timedelta(milliseconds=130))]
    )
    messages = to_messages(runs, NOW)
    assert [(eta, len(entries)) for eta, entries in messages] == [
        (None, 3),
        (later, 76),
        (later, 76),
        (later + ETA_STEP * 2, 1),
    ]
    assert sorted(e["run_id"] for _, entries in messages for e in entries) == sorted(
        str(r.run_id) for r in runs
    )


def test_a_steady_load_shares_messages_across_sparse_steps():
    """A shard's claim at 200 runs a second: a dozen runs spread over a second, a run
    or two per 100 ms step. They go in messages of a 200 ms step, never early."""
    start = NOW + timedelta(seconds=10)
    runs = [run(fire_at=start + timedelta(milliseconds=83 * i + 7)) for i in range(12)]
    messages = to_messages(runs, NOW)
    assert len(messages) <= 6  # not one a 100 ms step (11 of them)
    for eta, entries in messages:
        for entry in entries:
            fire_at = datetime.fromisoformat(entry["fire_at"])
            assert fire_at <= eta < fire_at + COARSE_ETA_STEP


def test_a_lone_run_keeps_its_step():
    """Nothing to share a message with: moving it to a coarser step would only make it later."""
    fire = NOW + timedelta(seconds=4, milliseconds=250)
    [(eta, _)] = to_messages([run(fire_at=fire)], NOW)
    assert eta == NOW + timedelta(seconds=4, milliseconds=300)
    # Two runs 100 ms apart, each alone in its step: one message, at the later boundary.
    pair = [run(fire_at=fire), run(fire_at=fire + timedelta(milliseconds=100))]
    assert [eta for eta, _ in to_messages(pair, NOW)] == [NOW + timedelta(seconds=4, milliseconds=400)]


@given(
    st.lists(st.integers(min_value=1, max_value=3_000_000), min_size=1, max_size=60),
    st.integers(min_value=0, max_value=40),
)
def test_a_run_never_goes_before_its_instant_and_late_only_in_a_sparse_step(offsets_us, dense):
    """Whatever the spread: no run's message runs before its instant; one runs at most
    COARSE_ETA_STEP late, and at most ETA_STEP late in a step of SPARSE_STEP_RUNS or more."""
    start = NOW + timedelta(seconds=1)
    fire = [start + timedelta(microseconds=us) for us in offsets_us] + [start] * dense
    messages = to_messages([run(fire_at=at) for at in fire], NOW)
    per_step: dict = {}
    for at in fire:
        per_step[eta_of(at, NOW)] = per_step.get(eta_of(at, NOW), 0) + 1
    for eta, entries in messages:
        for entry in entries:
            fire_at = datetime.fromisoformat(entry["fire_at"])
            assert fire_at <= eta < fire_at + COARSE_ETA_STEP
            if per_step[eta_of(fire_at, NOW)] >= SPARSE_STEP_RUNS:
                assert eta < fire_at + ETA_STEP


def test_a_few_one_offs_ride_with_the_recurring_runs_of_their_eta_but_a_burst_does_not():
    """At a steady load a step holds a run or two of each lane: one message, not two.
    A burst's one-offs keep a lane of their own, so a recurring job never waits behind them."""
    later = NOW + timedelta(seconds=3)
    few = [run(owner="a", fire_at=later) for _ in range(2)] + [run(owner="b", fire_at=later, recurring=True)]
    messages = to_messages(few, NOW)
    assert [(eta, len(entries)) for eta, entries in messages] == [(later, 3)]
    assert message_headers(messages[0][1])["punctual_lane"] == "recurring"

    burst = [run(owner="a", fire_at=later) for _ in range(20)] + [
        run(owner="b", fire_at=later, recurring=True)
    ]
    lanes = [message_headers(entries)["punctual_lane"] for _, entries in to_messages(burst, NOW)]
    assert lanes == ["recurring", "one-off"]

    alone = [run(owner="a", fire_at=later) for _ in range(2)]  # no recurring run to ride with
    assert [message_headers(e)["punctual_lane"] for _, e in to_messages(alone, NOW)] == ["one-off"]
