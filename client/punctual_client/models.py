"""Typed results of the SDK: Job, Run, Page, PreviewItem, BatchResult (plain dataclasses).

Instants are aware UTC datetimes. Every model keeps the JSON it came from in `raw`,
so a field added to the API later is never lost to an older SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from punctual_client.errors import APIError, error_for

__all__ = ["Job", "Run", "Page", "PreviewItem", "BatchResult", "parse_time"]

T = TypeVar("T")


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 instant from the API (always with an offset) as an aware datetime."""
    if text is None:
        return None
    return _instant(text)


def _instant(text: str) -> datetime:
    """parse_time for a field the API always sets."""
    return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    state: str  # scheduled | running | paused | completed | cancelled | dead
    next_run_at: datetime | None
    target: dict[str, Any]
    payload: Any
    schedule: dict[str, Any]
    retry: dict[str, Any]
    misfire: str
    dst: dict[str, Any]
    jitter_s: int
    attempt: int
    created_at: datetime
    updated_at: datetime
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=data["id"],
            name=data["name"],
            state=data["state"],
            next_run_at=parse_time(data.get("next_run_at")),
            target=data["target"],
            payload=data.get("payload"),
            schedule=data["schedule"],
            retry=data["retry"],
            misfire=data["misfire"],
            dst=data["dst"],
            jitter_s=data["jitter_s"],
            attempt=data["attempt"],
            created_at=_instant(data["created_at"]),
            updated_at=_instant(data["updated_at"]),
            raw=data,
        )


@dataclass(frozen=True)
class Run:
    id: str
    job_id: str
    scheduled_for: datetime
    attempt: int  # 1-based
    state: str  # claimed | running | succeeded | failed | dead | skipped | replayed
    started_at: datetime | None
    finished_at: datetime | None
    lateness_ms: int | None
    status_code: int | None
    error: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=data["id"],
            job_id=data["job_id"],
            scheduled_for=_instant(data["scheduled_for"]),
            attempt=data["attempt"],
            state=data["state"],
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            lateness_ms=data.get("lateness_ms"),
            status_code=data.get("status_code"),
            error=data.get("error"),
            raw=data,
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; pass `next_cursor` back to get the next (None: the last page)."""

    items: list[T]
    next_cursor: str | None

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class PreviewItem:
    at: datetime  # UTC
    local: datetime  # with the zone's offset
    dst: str | None  # None | gap_shifted | overlap_first | overlap_second

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreviewItem:
        return cls(at=_instant(data["at"]), local=_instant(data["local"]), dst=data.get("dst"))


@dataclass(frozen=True)
class BatchResult:
    """One job's answer in a batch create: 201 created, 200 an earlier job its
    idempotency_key stands for, or an error status with the problem as `error`."""

    status: int
    job: Job | None
    error: APIError | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the job exists now (created by this batch or before it)."""
        return self.error is None

    @property
    def created(self) -> bool:
        return self.status == 201

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchResult:
        status = int(data["status"])
        job = Job.from_json(data["job"]) if data.get("job") is not None else None
        error = None if job is not None else error_for(status, data.get("problem"))
        return cls(status=status, job=job, error=error, raw=data)
