"""Cursor pagination, newest first, over one or many physical shards.

A cursor is opaque to clients: base64url of "<kind>.<created_at in epoch us>.<id hex>",
the (created_at, id) of the last item of the page. The next page is every row strictly
below it in (created_at, id) order, so rows inserted meanwhile (which are newer) never
shift a page: each row is seen once. A cursor of another kind (a runs cursor given to
/jobs) or garbage is a 422 on `cursor`.

Listing across shards: each physical DSN answers its own `limit + 1` newest rows below
the cursor; merging those lists and cutting at `limit` is exact, because the global
top `limit` is contained in the union of the per-DSN tops.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from app.core.errors import ValidationError
from app.core.timefmt import from_micros, to_micros

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_CURSOR_MAX = 200

T = TypeVar("T")


@dataclass(frozen=True)
class Cursor:
    created_at: datetime
    id: uuid.UUID


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def parse_limit(raw: str | None) -> int:
    """The `limit` query parameter: 1-500, default 100; 422 on `limit` otherwise."""
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise ValidationError.single("limit", f"must be an integer from 1 to {MAX_LIMIT}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError.single("limit", f"must be an integer from 1 to {MAX_LIMIT}")
    return limit


def parse_flag(name: str, raw: str | None) -> bool | None:
    """A true/false query parameter (`?keyed=true`); absent or empty is None, anything
    but true or false is 422 on `name`."""
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ValidationError.single(name, "must be true or false")


def encode_cursor(kind: str, created_at: datetime, item_id: uuid.UUID) -> str:
    raw = f"{kind}.{to_micros(created_at)}.{item_id.hex}".encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(kind: str, text: str | None) -> Cursor | None:
    """The position a cursor names; None for no cursor; 422 on `cursor` for a bad one."""
    if text is None or text == "":
        return None
    try:
        if len(text) > _CURSOR_MAX:
            raise ValueError
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        got_kind, micros, hex_id = raw.split(".")
        if got_kind != kind or not micros.lstrip("-").isdigit():
            raise ValueError
        created_at = from_micros(int(micros))
        return Cursor(created_at, uuid.UUID(hex=hex_id))
    except (ValueError, binascii.Error, OverflowError, UnicodeError):
        raise ValidationError.single("cursor", "is not a cursor returned by this listing") from None


def newest_first(
    query: sa.Select,
    created_col: sa.ColumnElement,
    id_col: sa.ColumnElement,
    cursor: Cursor | None,
    limit: int,
) -> sa.Select:
    """`query` restricted to rows below `cursor`, newest first, one row more than a page."""
    if cursor is not None:
        query = query.where(
            sa.tuple_(created_col, id_col)
            < sa.tuple_(sa.literal(cursor.created_at, created_col.type), sa.literal(cursor.id, id_col.type))
        )
    return query.order_by(created_col.desc(), id_col.desc()).limit(limit + 1)


def merge_newest(
    kind: str, pages: Iterable[Sequence[Any]], limit: int, created_key: str, id_key: str
) -> Page:
    """Merge per-shard result lists (each newest first) into one page of `limit`."""

    def sort_key(row):
        return (row[created_key], row[id_key])

    merged = list(heapq.merge(*pages, key=sort_key, reverse=True))
    items = merged[:limit]
    next_cursor = None
    if len(merged) > limit:
        last = items[-1]
        next_cursor = encode_cursor(kind, last[created_key], last[id_key])
    return Page(items=items, next_cursor=next_cursor)
