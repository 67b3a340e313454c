"""The limiter contract, shared by the Redis and the in-process implementations.

For each run, a worker asks to start it under all of its specs (app.limits.policy)
at once. Admission is all or nothing, atomically: the run is admitted under every
spec, or it takes nothing now and learns why and until when (`Admission`).

- Rate (`rate_per_s` R): a GCRA with one second of burst. Each key keeps its
  theoretical arrival time `tat`; a start conforms when tat - (max(R, 1) - 1) / R <=
  now, and moves tat on by 1/R. A run held back has its start RESERVED at the next
  conforming instant (`retry_at`) under its `reserver` id (a schedule run's: its job
  id); back then, it is admitted without touching the rate again, so a held run is
  held once and starts come out at R/s. A reservation unused for RESERVATION_KEEP_S
  is forgotten (its job was paused or cancelled) with its turn.
- Concurrency cap (`max_concurrency` C): a run holds a slot from admission until
  `release`, or until its lease (`lease_s`, extended by `renew`) runs out, so a dead
  worker's slots come back by themselves. A run that finds every slot taken takes and
  reserves nothing (`reason` "cap"): no schedule predicts when a call ends, so the
  caller waits for a release (app.worker.slot_wait) and asks again (`retry_at`, at
  most `hold_s` away, is a hint).

A run blocked by a rate and a cap at once is held by the rate. `now` is the caller's
clock (unix seconds or an aware datetime), and `retry_at` comes in its form. A caller
on an event loop uses the `*_async` forms: the base class runs the blocking form on a
thread, the in-memory limiter answers at once, and the Redis one awaits a connection
of its own on the loop (a hop to a thread cost the loop more than the round trip).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from app.limits.policy import LimitSpec

__all__ = ["Admission", "Limiter", "Request", "RATE", "CAP"]

# (the run's specs, a holder id unique to the run: its run_id[, the reserver id that
# owns the run's rate reservations across holds: its job id for a schedule run])
Request = tuple[Sequence[LimitSpec], str] | tuple[Sequence[LimitSpec], str, str]

# When a capped key is full, the latest retry hint given (seconds).
DEFAULT_HOLD_S = 1.0
# An instant due this soon counts as come: unix times in floats are not exact to the
# microsecond, and a run that comes back at its retry time must find its turn.
EARLY_S = 1e-6
# How long an unused rate reservation is kept (seconds): a held run comes back at its
# turn unless its job was paused or cancelled, or the registry fell far behind.
RESERVATION_KEEP_S = 3600.0

RATE = "rate"  # held by a rate: a start is reserved at retry_at
CAP = "cap"  # every slot of a cap is taken: ask again when one frees


@dataclass(frozen=True)
class Admission:
    admitted: bool
    retry_at: float | datetime | None = None  # set when not admitted
    reason: str | None = None  # RATE or CAP when not admitted

    def retry_instant(self) -> datetime:
        """`retry_at` of a hold from acquire_many(now=<a datetime>), which answers in kind."""
        assert isinstance(self.retry_at, datetime)
        return self.retry_at


ADMITTED = Admission(True, None)


def rate_tolerance(rate_per_s: float) -> float:
    """How far ahead of now a key's tat may be for a start to conform: one second of
    burst (max(rate, 1) starts at once), at least one start."""
    return (max(rate_per_s, 1.0) - 1.0) / rate_per_s


class Limiter(ABC):
    """Rates and concurrency caps keyed by LimitSpec.key; thread-safe."""

    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        self.hold_s = hold_s

    def acquire_many(
        self, requests: Sequence[Request], now: float | datetime, lease_s: float
    ) -> list[Admission]:
        """Admit or hold each request, in order, each one atomically (see module doc).

        Requests without a limited spec are admitted without any I/O; the others
        cost one round trip for the whole batch.
        """
        todo, limited = _limited(requests)
        answers = self._acquire(limited, _seconds(now), float(lease_s)) if limited else []
        return _admissions(len(requests), todo, answers, now)

    async def acquire_many_async(
        self, requests: Sequence[Request], now: float | datetime, lease_s: float
    ) -> list[Admission]:
        """`acquire_many` for a caller on an event loop (module doc)."""
        todo, limited = _limited(requests)
        answers = await self._acquire_async(limited, _seconds(now), float(lease_s)) if limited else []
        return _admissions(len(requests), todo, answers, now)

    def acquire(
        self,
        specs: Sequence[LimitSpec],
        holder: str,
        now: float | datetime,
        lease_s: float,
        reserver: str | None = None,
    ) -> Admission:
        return self.acquire_many([(specs, holder, reserver or holder)], now, lease_s)[0]

    def release(self, specs: Sequence[LimitSpec], holder: str) -> None:
        """Give back `holder`'s concurrency slots (rate starts are spent for good)."""
        self.release_many([(specs, holder)])

    def release_many(self, items: Iterable[Request]) -> None:
        capped = _capped(items)
        if capped:
            self._release(capped)

    async def release_many_async(self, items: Iterable[Request]) -> None:
        """`release_many` for a caller on an event loop (module doc)."""
        capped = _capped(items)
        if capped:
            await self._release_async(capped)

    def renew(
        self, specs: Sequence[LimitSpec], holder: str, lease_s: float, now: float | datetime | None = None
    ) -> None:
        """Extend `holder`'s slots to now + lease_s (never shorter).

        A slot that was released, or dropped after its lease ran out, is not taken back.
        """
        self.renew_many([(specs, holder)], lease_s, now)

    def renew_many(
        self, items: Iterable[Request], lease_s: float, now: float | datetime | None = None
    ) -> None:
        capped = _capped(items)
        if capped:
            self._renew(capped, time.time() if now is None else _seconds(now), float(lease_s))

    def free_slots(self, caps: dict[str, int], now: float | datetime) -> dict[str, int]:
        """How many slots each cap (spec key -> max_concurrency) has free now; a
        read only, for runs waiting for a slot (app.worker.slot_wait)."""
        if not caps:
            return {}
        return _free(caps, self._held(list(caps), _seconds(now)))

    async def free_slots_async(self, caps: dict[str, int], now: float | datetime) -> dict[str, int]:
        """`free_slots` for a caller on an event loop (module doc)."""
        if not caps:
            return {}
        return _free(caps, await self._held_async(list(caps), _seconds(now)))

    async def aclose(self) -> None:
        """Close what the `*_async` forms opened for the running loop (before it stops)."""
        return None  # the blocking forms on threads open nothing of the loop's

    # The loop's forms of the storage's operations: on a thread unless the storage
    # answers without blocking (an override).

    async def _acquire_async(
        self, requests: list[tuple[tuple[LimitSpec, ...], str, str]], now: float, lease_s: float
    ) -> list[tuple[str, float] | None]:
        return await asyncio.to_thread(self._acquire, requests, now, lease_s)

    async def _release_async(self, items: list[tuple[str, str]]) -> None:
        await asyncio.to_thread(self._release, items)

    async def _held_async(self, keys: list[str], now: float) -> list[int]:
        return await asyncio.to_thread(self._held, keys, now)

    @abstractmethod
    def _held(self, keys: list[str], now: float) -> list[int]:
        """For each spec key: how many slots are held by leases running past `now`."""

    @abstractmethod
    def _acquire(
        self, requests: list[tuple[tuple[LimitSpec, ...], str, str]], now: float, lease_s: float
    ) -> list[tuple[str, float] | None]:
        """For each (specs, holder, reserver): None when admitted, else (reason, retry time)."""

    @abstractmethod
    def _release(self, items: list[tuple[str, str]]) -> None:
        """Drop each (spec key, holder) slot."""

    @abstractmethod
    def _renew(self, items: list[tuple[str, str]], now: float, lease_s: float) -> None:
        """Set each existing (spec key, holder) slot to expire at now + lease_s."""


def _limited(requests: Sequence[Request]) -> tuple[list[int], list[tuple[tuple[LimitSpec, ...], str, str]]]:
    """(the positions of the requests under some limit, those requests as (their limited
    specs, holder, reserver)): requests without a limited spec are admitted without I/O."""
    todo: list[int] = []
    limited: list[tuple[tuple[LimitSpec, ...], str, str]] = []
    for i, request in enumerate(requests):
        specs = tuple(s for s in request[0] if s.limited)
        if specs:
            todo.append(i)
            limited.append((specs, request[1], request[2] if len(request) > 2 else request[1]))
    return todo, limited


def _admissions(
    count: int, todo: list[int], answers: list[tuple[str, float] | None], now: float | datetime
) -> list[Admission]:
    """Each request's Admission from the storage's answers to the limited ones."""
    admissions = [ADMITTED] * count
    for i, answer in zip(todo, answers, strict=True):
        if answer is not None:
            reason, retry_at = answer
            at = datetime.fromtimestamp(retry_at, UTC) if isinstance(now, datetime) else retry_at
            admissions[i] = Admission(False, at, reason)
    return admissions


def _free(caps: dict[str, int], held: list[int]) -> dict[str, int]:
    """Each cap key's free slots, from its cap and the slots held under it."""
    return {key: max(0, cap - count) for (key, cap), count in zip(caps.items(), held, strict=True)}


def _seconds(now: float | datetime) -> float:
    return now.timestamp() if isinstance(now, datetime) else float(now)


def _capped(items: Iterable[Request]) -> list[tuple[str, str]]:
    return [(spec.key, item[1]) for item in items for spec in item[0] if spec.max_concurrency]
