"""The dispatch message: building, chunking and reading back (pure)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.lifecycle.message import (
    HOLD_SPAN,
    START_LEAD,
    DispatchRun,
    chunks,
    decode_runs,
    encode_runs,
    holds,
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


def test_a_run_whose_instant_has_come_goes_at_once():
    assert holds([run(), run(fire_at=NOW), run(fire_at=NOW - timedelta(seconds=3))], NOW) == [None] * 3
    # Due within the lead: at once too, the worker's timer waits for the instant.
    assert holds([run(fire_at=NOW + START_LEAD / 2)], NOW) == [None]


def test_runs_are_grouped_by_hold_and_the_due_ones_go_first():
    later = NOW + timedelta(seconds=5)
    runs = (
        [run(fire_at=later) for _ in range(150)]
        + [run() for _ in range(3)]
        + [run(fire_at=later - timedelta(milliseconds=30)) for _ in range(2)]  # open the hold
        + [run(fire_at=later + HOLD_SPAN)]  # the next hold
    )
    messages = to_messages(runs, NOW)
    opened = later - timedelta(milliseconds=30)
    assert [(eta, len(entries)) for eta, entries in messages] == [
        (None, 3),
        (opened - START_LEAD, 76),
        (opened - START_LEAD, 76),
        (later + HOLD_SPAN - START_LEAD, 1),
    ]
    assert sorted(e["run_id"] for _, entries in messages for e in entries) == sorted(
        str(r.run_id) for r in runs
    )


def test_a_steady_load_shares_one_message_per_poll():
    """A shard's claim at 200 runs a second: a dozen runs spread over a poll interval.
    One message, not one per 100 ms step."""
    start = NOW + timedelta(seconds=10)
    runs = [run(fire_at=start + timedelta(milliseconds=83 * i + 7)) for i in range(12)]
    [(eta, entries)] = to_messages(runs, NOW)
    assert eta == start + timedelta(milliseconds=7) - START_LEAD
    assert len(entries) == 12


@given(
    st.lists(st.integers(min_value=1, max_value=10_000_000), min_size=1, max_size=60),
    st.integers(min_value=0, max_value=40),
)
def test_a_message_never_runs_after_its_first_instant_nor_holds_a_run_longer_than_the_span(offsets_us, dense):
    """Whatever the spread: a message runs START_LEAD before its first run's instant (or
    at once), and none of its runs fires HOLD_SPAN or more after that instant."""
    start = NOW + timedelta(seconds=1)
    fire = [start + timedelta(microseconds=us) for us in offsets_us] + [start] * dense
    messages = to_messages([run(fire_at=at) for at in fire], NOW)
    assert sum(len(entries) for _, entries in messages) == len(fire)
    for eta, entries in messages:
        instants = [datetime.fromisoformat(entry["fire_at"]) for entry in entries]
        first = min(instants)
        assert eta == (first - START_LEAD if first - START_LEAD > NOW else None)
        assert max(instants) < first + HOLD_SPAN


def test_a_few_one_offs_ride_with_the_recurring_runs_of_their_eta_but_a_burst_does_not():
    """At a steady load a step holds a run or two of each lane: one message, not two.
    A burst's one-offs keep a lane of their own, so a recurring job never waits behind them."""
    later = NOW + timedelta(seconds=3)
    few = [run(owner="a", fire_at=later) for _ in range(2)] + [run(owner="b", fire_at=later, recurring=True)]
    messages = to_messages(few, NOW)
    assert [(eta, len(entries)) for eta, entries in messages] == [(later - START_LEAD, 3)]
    assert message_headers(messages[0][1])["punctual_lane"] == "recurring"

    burst = [run(owner="a", fire_at=later) for _ in range(20)] + [
        run(owner="b", fire_at=later, recurring=True)
    ]
    lanes = [message_headers(entries)["punctual_lane"] for _, entries in to_messages(burst, NOW)]
    assert lanes == ["recurring", "one-off"]

    alone = [run(owner="a", fire_at=later) for _ in range(2)]  # no recurring run to ride with
    assert [message_headers(e)["punctual_lane"] for _, e in to_messages(alone, NOW)] == ["one-off"]


def test_runs_orjson_cannot_write_travel_as_the_standard_librarys_text():
    big = run(payload={"n": 2**70, "s": "\ud800"})
    text = encode_runs([big.to_message()])
    assert [DispatchRun.from_message(e) for e in decode_runs(text)] == [big]
    assert json.loads(text)[0]["payload"]["n"] == 2**70


def test_a_run_read_from_a_message_has_every_field_and_stays_frozen():
    original = run(fire_at=NOW, recurring=True, own_lease=True)
    read = DispatchRun.from_message(json.loads(json.dumps(original.to_message())))
    assert read == original
    assert {f.name: getattr(read, f.name) for f in dataclasses.fields(read)} == dataclasses.asdict(original)
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.attempt = 3  # type: ignore[misc]


def test_a_run_read_from_a_message_keeps_the_messages_texts_of_its_ids():
    original = run()
    message = original.to_message()
    read = DispatchRun.from_message(message)
    assert read.texts == (str(original.run_id), str(original.job_id), str(original.lease_token))
    assert read.texts[1] is message["job_id"]  # not printed again
    made = run()
    assert made.texts == (str(made.run_id), str(made.job_id), str(made.lease_token))


@pytest.mark.parametrize(
    "form",
    [
        str.upper,
        lambda text: text.replace("-", ""),
        lambda text: "{" + text + "}",
        lambda text: "urn:uuid:" + text,
    ],
)
def test_an_id_in_another_form_than_str_prints_is_printed_anew(form):
    original = run()
    message = {**original.to_message(), "job_id": form(str(original.job_id))}
    read = DispatchRun.from_message(message)
    assert read.job_id == original.job_id
    assert read.texts == (str(original.run_id), str(original.job_id), str(original.lease_token))


def test_a_roll_keeps_what_a_hold_reads_of_a_run_read_from_a_message():
    from app.worker.orphans import entry, taken_runs

    original = run(fire_at=NOW + timedelta(microseconds=123457), own_lease=True)
    read = DispatchRun.from_message(original.to_message())
    started_at = NOW + timedelta(microseconds=999_999)
    text = entry(read, started_at)
    assert text == entry(original, started_at)
    assert text == (
        f"{original.shard} {original.job_id} {original.lease_token} 1 {original.fire_at.timestamp()!r} "
        f"{int(NOW.timestamp()) * 1_000_000 + 999_999}"
    )
    [(held, due, started)] = taken_runs({str(original.run_id): text}, NOW)
    assert started == started_at  # to the microsecond: the hold compares it exactly
    assert (held.run_id, held.job_id, held.lease_token, held.shard) == (
        original.run_id,
        original.job_id,
        original.lease_token,
        original.shard,
    )
    assert held.own_lease and due == original.fire_at


def test_a_roll_entry_of_the_version_before_is_read_without_its_start_instant():
    """Written by a worker of the version before (a rolling upgrade): taken, it is held
    back fenced by its token alone, as then, rather than failing the whole take."""
    from app.worker.orphans import entry, taken_runs

    original = run()
    older = entry(original, NOW).rsplit(" ", 1)[0]
    [(held, due, started)] = taken_runs({str(original.run_id): older}, NOW)
    assert held.lease_token == original.lease_token and due == original.scheduled_for
    assert started is None
