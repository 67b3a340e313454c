"""app.services.pagination: opaque cursors, validated limits, exact merges across shards."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.core.errors import ValidationError
from app.services.pagination import decode_cursor, encode_cursor, merge_newest, parse_limit


def test_cursor_round_trips_to_the_microsecond():
    at = datetime(2026, 3, 29, 1, 0, 0, 123456, tzinfo=UTC)
    key = uuid.uuid4()
    cursor = decode_cursor("j", encode_cursor("j", at, key))
    assert (cursor.created_at, cursor.id) == (at, key)


@pytest.mark.parametrize(
    "text", ["garbage", "x" * 300, "%%%", encode_cursor("r", datetime.now(UTC), uuid.uuid4())]
)
def test_a_bad_or_foreign_cursor_is_422_on_cursor(text):
    with pytest.raises(ValidationError) as exc:
        decode_cursor("j", text)
    assert exc.value.errors[0].field == "cursor"


@pytest.mark.parametrize("raw, expected", [(None, 100), ("", 100), ("1", 1), ("500", 500)])
def test_limit(raw, expected):
    assert parse_limit(raw) == expected


@pytest.mark.parametrize("raw", ["0", "501", "-1", "ten", "1.5"])
def test_bad_limit_is_422_on_limit(raw):
    with pytest.raises(ValidationError) as exc:
        parse_limit(raw)
    assert exc.value.errors[0].field == "limit"


def test_merge_takes_the_global_newest_and_cuts_a_cursor_at_the_last_item():
    base = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [{"created_at": base + timedelta(seconds=i), "id": uuid.UUID(int=i)} for i in range(10)]
    shard_a = sorted(rows[::2], key=lambda r: r["created_at"], reverse=True)[:4]
    shard_b = sorted(rows[1::2], key=lambda r: r["created_at"], reverse=True)[:4]
    page = merge_newest("j", [shard_a, shard_b], 3, "created_at", "id")
    assert [r["id"].int for r in page.items] == [9, 8, 7]
    assert decode_cursor("j", page.next_cursor).id.int == 7
    last = merge_newest("j", [shard_a[:1], []], 3, "created_at", "id")
    assert last.next_cursor is None
