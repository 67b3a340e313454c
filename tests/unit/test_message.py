"""The dispatch message: building, chunking and reading back (pure)."""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from app.tasks.message import DispatchRun, chunks, to_messages


def run(**overrides) -> DispatchRun:
    values = dict(
        run_id=uuid.uuid4(), job_id=uuid.uuid4(), shard=3, owner="acme", origin="schedule",
        lease_token=uuid.uuid4(), scheduled_for=datetime(2026, 12, 1, tzinfo=timezone.utc), attempt=2,
        target={"type": "webhook", "url": "https://example.com/hook"}, retry={"max_attempts": 5},
        payload={"any": ["json", 1]},
    )
    values.update(overrides)
    return DispatchRun(**values)


def test_an_entry_survives_json_both_ways():
    original = run(scheduled_for=datetime(2026, 12, 1, 0, 0, 0, 123000, tzinfo=timezone.utc))
    entry = json.loads(json.dumps(original.to_message()))
    assert entry["scheduled_for"] == "2026-12-01T00:00:00.123Z"
    assert DispatchRun.from_message(entry) == original


def test_the_signing_secret_is_never_on_the_broker():
    assert not any("secret" in key for key in run().to_message())


def test_off_schedule_runs_hold_their_own_lease():
    assert not run().off_schedule
    assert run(origin="trigger").off_schedule and run(origin="replay").off_schedule


def test_chunks_are_even_and_keep_the_order():
    items = list(range(501))
    parts = list(chunks(items, 100))
    assert [len(p) for p in parts] == [84, 84, 84, 83, 83, 83]
    assert [x for p in parts for x in p] == items
    assert list(chunks([], 100)) == []
    assert [len(p) for p in chunks(list(range(100)), 100)] == [100]


def test_a_claim_batch_becomes_a_few_messages():
    messages = to_messages([run() for _ in range(500)])
    assert len(messages) == 5 and all(len(m) == 100 for m in messages)
