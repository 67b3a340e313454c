"""Typed values of the SDK: what a job is made of, and what the API answers.

What a caller sends (targets, schedules, retry and DST policies) are TypedDicts:
plain dicts at run time, checked by a type checker (docs/api.md "Create:
`POST /jobs`" gives every field). States and policies are Literals. Results (Job, Run,
Page, PreviewItem, BatchResult) are frozen dataclasses; instants are aware UTC
datetimes. Every result keeps the JSON it came from in `raw`, so a field added to
the API later is never lost to an older SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, NotRequired, TypeAlias, TypedDict, TypeVar

from punctual_client.errors import APIError, error_for

__all__ = [
    "Job",
    "Run",
    "Page",
    "PreviewItem",
    "BatchResult",
    "Selected",
    "Put",
    "Backfill",
    "parse_time",
    "JobState",
    "RunState",
    "Misfire",
    "Overlap",
    "RunOrigin",
    "Change",
    "DstFlag",
    "HttpMethod",
    "Limits",
    "WebhookTarget",
    "QueueTarget",
    "PostgresTarget",
    "Target",
    "OneOffSchedule",
    "CronSchedule",
    "IntervalSchedule",
    "Schedule",
    "RetryPolicy",
    "DstPolicy",
]

T = TypeVar("T")

JobState: TypeAlias = Literal["scheduled", "running", "paused", "completed", "cancelled", "dead"]
RunState: TypeAlias = Literal["claimed", "running", "succeeded", "failed", "dead", "skipped", "replayed"]
Misfire: TypeAlias = Literal["run_once", "run_all", "skip"]
Overlap: TypeAlias = Literal["buffer_one", "skip", "allow"]
RunOrigin: TypeAlias = Literal["schedule", "trigger", "replay", "backfill"]
Change: TypeAlias = Literal["created", "updated", "unchanged"]
DstFlag: TypeAlias = Literal["gap_shifted", "overlap_first", "overlap_second"]
HttpMethod: TypeAlias = Literal["POST", "PUT", "GET", "DELETE", "PATCH"]
Instant: TypeAlias = datetime | str  # an aware datetime, or RFC 3339 text with an offset


class Limits(TypedDict, total=False):
    """A target's limits: jobs of one owner with the same `key` share them."""

    key: str
    rate_per_s: float
    max_concurrency: int


class WebhookTarget(TypedDict):
    type: Literal["webhook"]
    url: str
    method: NotRequired[HttpMethod]
    headers: NotRequired[dict[str, str]]
    timeout_s: NotRequired[float]
    limits: NotRequired[Limits]


class QueueTarget(TypedDict):
    """A topic on the AMQP exchange `punctual.jobs`."""

    type: Literal["queue"]
    topic: str
    limits: NotRequired[Limits]


class PostgresTarget(TypedDict):
    """An inbox row per occurrence in a target database the operator granted (its alias)."""

    type: Literal["postgres"]
    database: str
    limits: NotRequired[Limits]


Target: TypeAlias = WebhookTarget | QueueTarget | PostgresTarget


class OneOffSchedule(TypedDict):
    run_at: Instant


class CronSchedule(TypedDict):
    cron: str
    timezone: NotRequired[str]  # an IANA zone id; UTC when left out
    start_at: NotRequired[Instant]
    end_at: NotRequired[Instant]


class IntervalSchedule(TypedDict):
    interval_s: int
    start_at: NotRequired[Instant]
    end_at: NotRequired[Instant]


Schedule: TypeAlias = OneOffSchedule | CronSchedule | IntervalSchedule


class RetryPolicy(TypedDict, total=False):
    max_attempts: int
    backoff_s: float
    max_backoff_s: float


class DstPolicy(TypedDict, total=False):
    gap: Literal["shift", "skip"]
    overlap: Literal["once", "twice"]


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
    state: JobState
    next_run_at: datetime | None
    target: Target
    payload: Any
    schedule: Schedule
    retry: RetryPolicy
    misfire: Misfire
    dst: DstPolicy
    jitter_s: int
    attempt: int
    created_at: datetime
    updated_at: datetime
    raw: dict[str, Any] = field(repr=False, compare=False)
    labels: dict[str, str] = field(default_factory=dict)
    key: str | None = None  # set by put_job (PUT /jobs/by-key/{key})
    overlap: Overlap = "buffer_one"

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
            labels=dict(data.get("labels") or {}),
            key=data.get("key"),
            overlap=data.get("overlap", "buffer_one"),
        )


@dataclass(frozen=True)
class Run:
    id: str
    job_id: str
    scheduled_for: datetime
    attempt: int  # 1-based
    state: RunState
    started_at: datetime | None
    finished_at: datetime | None
    lateness_ms: int | None
    status_code: int | None
    error: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    origin: RunOrigin = "schedule"
    job_name: str | None = None  # given by GET /dead-letters only

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
            origin=data.get("origin", "schedule"),
            job_name=data.get("job_name"),
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
    dst: DstFlag | None

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


@dataclass(frozen=True)
class Selected:
    """What a label verb (pause_jobs, resume_jobs, cancel_jobs) did: the jobs the
    selector matched, and how many of them it changed."""

    matched: int
    changed: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Selected:
        return cls(matched=int(data["matched"]), changed=int(data["changed"]))


@dataclass(frozen=True)
class Put:
    """What put_job did (or, with dry_run, would do): `change` is created, updated or
    unchanged, and `job` the job as it is (or would be) after it."""

    change: Change
    job: Job


@dataclass(frozen=True)
class Backfill:
    """What backfill_job made: one `backfill` run for each of `count` occurrences,
    the oldest at `first` and the latest at `last` (None when the range held none)."""

    job_id: str
    count: int
    first: datetime | None
    last: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Backfill:
        return cls(
            job_id=data["job_id"],
            count=int(data["count"]),
            first=parse_time(data.get("first")),
            last=parse_time(data.get("last")),
        )
