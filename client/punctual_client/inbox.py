"""Consuming a `postgres` target's inbox in the receiving application's own transactions.

Punctual writes one `punctual_inbox` row per occurrence (its Idempotency-Key is the
primary key) into a database the operator named, and never a second one. The
application takes pending rows with SELECT ... FOR UPDATE SKIP LOCKED, does its work
with the same connection, and marks them done in the same transaction: the work
and the mark commit together, so a row is handled once even when several
consumers run, and a consumer that dies mid-batch leaves its rows pending for the
next one (docs/api.md "Postgres targets").

Any DB-API connection whose driver takes `%s` parameters (psycopg 3, psycopg2) will
do; this module imports no driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["InboxRow", "consume_inbox"]

_TAKE = (
    "SELECT idempotency_key, job_id, owner, scheduled_for, attempt, payload, inserted_at "
    "FROM punctual_inbox WHERE done_at IS NULL ORDER BY inserted_at LIMIT %s FOR UPDATE SKIP LOCKED"
)
_DONE = "UPDATE punctual_inbox SET done_at = now() WHERE idempotency_key = %s"


@dataclass(frozen=True)
class InboxRow:
    idempotency_key: str  # `<job_id>:<scheduled_for>`, the occurrence's Idempotency-Key
    job_id: str
    owner: str
    scheduled_for: datetime
    attempt: int  # the attempt that wrote the row
    payload: Any  # the job's payload, decoded JSON
    inserted_at: datetime


def consume_inbox(connection: Any, handle: Callable[[Any, InboxRow], None], *, limit: int = 100) -> int:
    """Handle up to `limit` pending rows in one transaction of `connection`; answers
    how many. `handle(cursor, row)` does the application's work with `cursor` (same
    transaction). If it raises, the transaction is rolled back (the work and the
    marks of this batch with it) and the exception goes to the caller: the rows stay
    pending. Call it in a loop; 0 means nothing is pending now."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    cursor = connection.cursor()
    try:
        cursor.execute(_TAKE, (limit,))
        rows = [InboxRow(str(r[0]), str(r[1]), r[2], r[3], r[4], r[5], r[6]) for r in cursor.fetchall()]
        for row in rows:
            handle(cursor, row)
            cursor.execute(_DONE, (row.idempotency_key,))
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    finally:
        cursor.close()
    return len(rows)
