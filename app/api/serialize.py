"""Rows -> the JSON objects of docs/api.md (jobs, runs, pages, previews).

Instants are RFC 3339 UTC with `Z` (app.core.timefmt.format_instant); a job's schedule,
retry and dst come back through the pure core's own `to_json`, so what a client
reads is what it could send again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.schedules import PreviewItem
from app.core.timefmt import format_instant, format_local
from app.registry.records import Row, dst_of, retry_of, schedule_of
from app.services.pagination import Page


def _instant(value) -> str | None:
    return None if value is None else format_instant(value)


def _number(value: Any) -> Any:
    # Float columns give 10.0 for a stored 10: print whole numbers as integers so a
    # job reads the same on create and on every later GET.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def job_json(row: Row) -> dict:
    retry = {key: _number(value) for key, value in retry_of(row).to_json().items()}
    return {
        "id": str(row["job_id"]),
        "key": row["job_key"],
        "name": row["name"],
        "state": row["state"],
        "next_run_at": _instant(row["next_run_at"]),
        "target": row["target"],
        "payload": row["payload"],
        "schedule": schedule_of(row).to_json(),
        "retry": retry,
        "misfire": row["misfire"],
        "dst": dst_of(row).to_json(),
        "jitter_s": row["jitter_s"],
        "overlap": row["overlap"],
        "attempt": row["attempt"],
        "labels": row["labels"],
        "created_at": format_instant(row["created_at"]),
        "updated_at": format_instant(row["updated_at"]),
    }


def run_json(row: Row) -> dict:
    return {
        "id": str(row["run_id"]),
        "job_id": str(row["job_id"]),
        "origin": row["origin"],
        "scheduled_for": format_instant(row["scheduled_for"]),
        "attempt": row["attempt"],
        "state": row["state"],
        "started_at": _instant(row["started_at"]),
        "finished_at": _instant(row["finished_at"]),
        "lateness_ms": row["lateness_ms"],
        "status_code": row["status_code"],
        "error": row["error"],
    }


def dead_letter_json(row: Row) -> dict:
    """A dead run as `run_json` has it, plus its job's name (docs/api.md "Runs")."""
    return {**run_json(row), "job_name": row["job_name"]}


def page_json(page: Page, item: Callable[[Row], dict]) -> dict:
    return {"items": [item(row) for row in page.items], "next_cursor": page.next_cursor}


def preview_json(items: list[PreviewItem]) -> dict:
    return {
        "items": [{"at": format_instant(i.at), "local": format_local(i.local), "dst": i.dst} for i in items]
    }
