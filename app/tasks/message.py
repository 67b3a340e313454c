"""The dispatch message: one Celery message carries a batch of runs.

Each entry holds all a worker needs without reading the job (internals.md, "The
dispatch message"): run_id, job_id, shard, owner, origin, lease_token,
scheduled_for, attempt, the target and retry snapshots and the payload. The
signing secret is never on the broker; the worker looks it up.

Pure: building entries from run rows, chunking, and parsing them back.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping

from app.timefmt import format_instant, parse_instant

# Runs per dispatch message. A claim batch of 500 becomes 5 messages, so the
# processes of one or several workers start a burst in parallel, while the broker
# still sees ~100x fewer messages than runs.
CHUNK_RUNS = 100


@dataclass(frozen=True)
class DispatchRun:
    run_id: uuid.UUID
    job_id: uuid.UUID
    shard: int
    owner: str
    origin: str  # schedule | trigger | replay
    lease_token: uuid.UUID
    scheduled_for: datetime
    attempt: int
    target: dict
    retry: dict
    payload: Any

    @property
    def off_schedule(self) -> bool:
        """Trigger and replay runs hold their lease on the run row, not the job."""
        return self.origin != "schedule"

    def to_message(self) -> dict:
        return {
            "run_id": str(self.run_id),
            "job_id": str(self.job_id),
            "shard": self.shard,
            "owner": self.owner,
            "origin": self.origin,
            "lease_token": str(self.lease_token),
            "scheduled_for": format_instant(self.scheduled_for),
            "attempt": self.attempt,
            "target": self.target,
            "retry": self.retry,
            "payload": self.payload,
        }

    @classmethod
    def from_message(cls, entry: Mapping[str, Any]) -> "DispatchRun":
        return cls(
            run_id=uuid.UUID(entry["run_id"]),
            job_id=uuid.UUID(entry["job_id"]),
            shard=int(entry["shard"]),
            owner=entry["owner"],
            origin=entry["origin"],
            lease_token=uuid.UUID(entry["lease_token"]),
            scheduled_for=parse_instant(entry["scheduled_for"]),
            attempt=int(entry["attempt"]),
            target=entry["target"],
            retry=entry["retry"] or {},
            payload=entry.get("payload"),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any], payload: Any) -> "DispatchRun":
        """From a runs row (plus the job's payload, which runs do not store)."""
        return cls(
            run_id=row["run_id"],
            job_id=row["job_id"],
            shard=row["shard"],
            owner=row["owner"],
            origin=row["origin"],
            lease_token=row["lease_token"],
            scheduled_for=row["scheduled_for"],
            attempt=row["attempt"],
            target=row["target"],
            retry=row["retry"] or {},
            payload=payload,
        )


def chunks(items: list, size: int = CHUNK_RUNS) -> Iterator[list]:
    """`items` in consecutive slices of at most `size`, spread evenly.

    501 runs become six slices of 83-84 rather than 5 x 100 + 1, so no message is a
    straggler.
    """
    if not items:
        return
    count = -(-len(items) // size)
    base, extra = divmod(len(items), count)
    start = 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        yield items[start:end]
        start = end


def to_messages(runs: Iterable[DispatchRun], size: int = CHUNK_RUNS) -> list[list[dict]]:
    return [[run.to_message() for run in chunk] for chunk in chunks(list(runs), size)]
