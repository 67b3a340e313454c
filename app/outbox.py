"""Run rows: the history and the outbox in one table (see app.schema's docstring).

`run_row` is the one place a new run row is shaped: every row carries every column,
so a batch of them is one INSERT (app.bulk.insert_many), and what a claim, a
skipped occurrence or an off-schedule retry writes differs only in what they say.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any


def run_row(*, job_id: uuid.UUID, shard: int, owner: str, origin: str, scheduled_for: datetime, attempt: int,
            state: str, target: Any, retry: dict, now: datetime, **columns: Any) -> dict:
    """A new runs row; `columns` sets any of the others (lease_token, due_at, published, ...)."""
    row = {
        "run_id": uuid.uuid4(),
        "job_id": job_id,
        "shard": shard,
        "owner": owner,
        "origin": origin,
        "scheduled_for": scheduled_for,
        "attempt": attempt,
        "state": state,
        "lease_token": None,
        "leased_until": None,
        "due_at": None,
        "published": True,
        "target": target,
        "retry": retry,
        "started_at": None,
        "finished_at": None,
        "lateness_ms": None,
        "status_code": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
    }
    unknown = set(columns) - set(row)
    if unknown:
        raise TypeError(f"not a runs column: {', '.join(sorted(unknown))}")
    row.update(columns)
    return row
