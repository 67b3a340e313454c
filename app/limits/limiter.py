"""The limiter contract, shared by the Redis and the in-process implementations.

For each run, a worker asks to start it under all of its specs (app.limits.policy)
at once. Admission is all or nothing, atomically: either the run takes one token
from every rate-limited spec and one slot in every capped spec, or it takes
nothing and learns the earliest time it may start (`retry_at`).

- Token bucket: a bucket holds `max(rate_per_s, 1)` tokens (one second of burst;
  at least one token, so that rates below 1/s can admit anything), refilled
  continuously at `rate_per_s`. A start takes one token; nothing gives it back.
- Concurrency cap: a run holds a slot from admission until `release`, or until its
  lease (`lease_s`, extended by `renew`) runs out, so a dead worker's slots come back
  by themselves.
- Spreading: runs held behind one limit are given DIFFERENT retry times, one
  token interval (1/rate) apart for a bucket, `hold_s / max_concurrency` apart for
  a cap, so that they come back about as fast as the limit lets them through rather
  than all at once. These are hints: admission itself only ever looks at tokens
  and slots, so the limits hold whatever the hints were.

`now` is the caller's clock: unix seconds, or an aware datetime. `retry_at` comes
back in the same form.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

from app.limits.policy import LimitSpec

__all__ = ["Admission", "Limiter", "Request"]

# (the run's specs, a holder id unique to the run: its run_id)
Request = tuple[Sequence[LimitSpec], str]

# When a capped key is full, how soon a slot is expected to free up (seconds).
DEFAULT_HOLD_S = 1.0
# A token due this soon counts as there: unix times in floats are exact to ~0.2 us
# only, and a run that comes back at its retry time must find its token.
EARLY_S = 1e-6


@dataclass(frozen=True)
class Admission:
    admitted: bool
    retry_at: float | datetime | None = None  # set when not admitted

    def retry_instant(self) -> datetime:
        """`retry_at` of a hold from acquire_many(now=<a datetime>), which answers in kind."""
        assert isinstance(self.retry_at, datetime)
        return self.retry_at


ADMITTED = Admission(True, None)


class Limiter(ABC):
    """Token buckets and concurrency caps keyed by LimitSpec.key; thread-safe."""

    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        self.hold_s = hold_s

    def acquire_many(self, requests: Sequence[Request], now: float | datetime, lease_s: float) -> list[Admission]:
        """Admit or hold each request, in order, each one atomically (see module doc).

        Requests without a limited spec are admitted without any I/O; the others
        cost one round trip for the whole batch.
        """
        now_s = _seconds(now)
        limited = [(tuple(s for s in specs if s.limited), holder) for specs, holder in requests]
        admissions = [ADMITTED] * len(limited)
        todo = [i for i, (specs, _) in enumerate(limited) if specs]
        if todo:
            answers = self._acquire([limited[i] for i in todo], now_s, float(lease_s))
            for i, retry_at in zip(todo, answers):
                if retry_at is not None:
                    at = datetime.fromtimestamp(retry_at, timezone.utc) if isinstance(now, datetime) else retry_at
                    admissions[i] = Admission(False, at)
        return admissions

    def acquire(self, specs: Sequence[LimitSpec], holder: str, now: float | datetime, lease_s: float) -> Admission:
        return self.acquire_many([(specs, holder)], now, lease_s)[0]

    def release(self, specs: Sequence[LimitSpec], holder: str) -> None:
        """Give back `holder`'s concurrency slots (tokens are spent for good)."""
        self.release_many([(specs, holder)])

    def release_many(self, items: Iterable[Request]) -> None:
        capped = _capped(items)
        if capped:
            self._release(capped)

    def renew(self, specs: Sequence[LimitSpec], holder: str, lease_s: float,
              now: float | datetime | None = None) -> None:
        """Extend `holder`'s slots to now + lease_s (never shorter).

        A slot that was released, or dropped after its lease ran out, is not taken back.
        """
        self.renew_many([(specs, holder)], lease_s, now)

    def renew_many(self, items: Iterable[Request], lease_s: float, now: float | datetime | None = None) -> None:
        capped = _capped(items)
        if capped:
            self._renew(capped, time.time() if now is None else _seconds(now), float(lease_s))

    @abstractmethod
    def _acquire(self, requests: list[tuple[tuple[LimitSpec, ...], str]], now: float, lease_s: float) -> list[float | None]:
        """For each request: None when admitted, else the retry time (unix seconds)."""

    @abstractmethod
    def _release(self, items: list[tuple[str, str]]) -> None:
        """Drop each (spec key, holder) slot."""

    @abstractmethod
    def _renew(self, items: list[tuple[str, str]], now: float, lease_s: float) -> None:
        """Set each existing (spec key, holder) slot to expire at now + lease_s."""


def _seconds(now: float | datetime) -> float:
    return now.timestamp() if isinstance(now, datetime) else float(now)


def _capped(items: Iterable[Request]) -> list[tuple[str, str]]:
    return [(spec.key, holder) for specs, holder in items for spec in specs if spec.max_concurrency]
