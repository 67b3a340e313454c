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
  most `hold_s` away, is a hint). When it is full, its slots go by turns (`Limiter`).

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.limits.line import ANYONE, Ahead, Tags, Turn
from app.limits.policy import LimitSpec

__all__ = ["Admission", "Limiter", "Look", "Request", "Waiting", "RATE", "CAP"]

# (the run's specs, a holder id unique to the run: its run_id[, the reserver id that
# owns the run's rate reservations across holds: its job id for a schedule run[, its
# turn in a full cap's line]])
Request = (
    tuple[Sequence[LimitSpec], str]
    | tuple[Sequence[LimitSpec], str, str]
    | tuple[Sequence[LimitSpec], str, str, Turn]
)
# A request as the storage sees it: its limited specs, holder, reserver and turn.
Limited = tuple[tuple[LimitSpec, ...], str, str, Turn]

# When a capped key is full, the latest retry hint given (seconds).
DEFAULT_HOLD_S = 1.0
# An instant due this soon counts as come: unix times in floats are not exact to the
# microsecond, and a run that comes back at its retry time must find its turn.
EARLY_S = 1e-6
# How long an unused rate reservation is kept (seconds): a held run comes back at its
# turn unless its job was paused or cancelled, or the registry fell far behind.
RESERVATION_KEEP_S = 3600.0
# How long a line's record of its waiting runs lasts unless its next look renews it
# (seconds): the runs of a worker that died stop holding a cap's slots back after this.
LINE_KEEP_S = 1.0
# How many flows waiting in other lines a look shows, first in turn first.
AHEAD_SHOWN = 16
# How long a cap's tags outlive its last admission (seconds): the owners of a cap
# nobody used for this long start level again.
TAGS_KEEP_S = 60.0
# A cap's tags are pruned of the flows level with their clock past this many (a read
# of them all: only where owners beyond the thousands come and go on one cap).
TAGS_PRUNED_PAST = 4096

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


@dataclass(frozen=True)
class Waiting:
    """A cap's runs waiting in one line, by turn, and the slots the line handed on from
    call to call (by turn) since its last look: the limiter charges them as admissions."""

    key: str
    max_concurrency: int
    runs: Mapping[Turn, int]
    served: Mapping[Turn, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Look:
    """A cap as a line sees it: its free slots, how many of the line's runs of each
    flow may take one now (the turns of the flows waiting elsewhere kept), the cap's
    clocks with the finish tags of the line's flows, and the flows waiting in other
    lines, first in turn first (at most AHEAD_SHOWN)."""

    free: int
    grants: dict[str, int]
    tags: Tags
    ahead: tuple[Ahead, ...]


def by_flow(runs: Mapping[Turn, int]) -> dict[str, tuple[int, int]]:
    """Runs by turn -> flow -> (weight, runs): a weight changed meanwhile, the higher."""
    flows: dict[str, tuple[int, int]] = {}
    for turn, count in runs.items():
        if count > 0:
            weight, before = flows.get(turn.flow, (turn.weight, 0))
            flows[turn.flow] = (max(weight, turn.weight), before + count)
    return flows


def rate_tolerance(rate_per_s: float) -> float:
    """How far ahead of now a key's tat may be for a start to conform: one second of
    burst (max(rate, 1) starts at once), at least one start."""
    return (max(rate_per_s, 1.0) - 1.0) / rate_per_s


class Limiter(ABC):
    """Rates and concurrency caps keyed by LimitSpec.key; thread-safe.

    Turns: when a cap is full, its slots go to the runs waiting for it in turns, not to
    whoever asks first (app.limits.line: recurring runs first, then the owners by
    weighted start-time fair queueing). A request may name its `Turn` (its fourth
    item; without one it is ANYONE's); a caller that keeps runs waiting (a worker
    process's slot gate) names its `line` and tells the limiter, at each `look`, how
    many of its runs wait for each cap and how many slots it handed on meanwhile. An
    admission then refuses a run (reason "cap") a free slot that the turns give to a
    flow waiting in another line; the look answers which of the line's flows may take
    the free slots now, and the flows waiting elsewhere ahead, so that a slot ending
    in the line goes to the run next in turn or back to the limiter. A line's record
    lasts LINE_KEEP_S unless its next look renews it, so a dead worker's waiting runs
    stop holding slots back by themselves.
    """

    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        self.hold_s = hold_s

    def acquire_many(
        self, requests: Sequence[Request], now: float | datetime, lease_s: float, line: str = ""
    ) -> list[Admission]:
        """Admit or hold each request, in order, each one atomically (see module doc);
        `line`: the asker's, whose own waiting runs hold no slot back from it.

        Requests without a limited spec are admitted without any I/O; the others
        cost one round trip for the whole batch.
        """
        todo, limited = _limited(requests)
        answers = self._acquire(limited, _seconds(now), float(lease_s), line) if limited else []
        return _admissions(len(requests), todo, answers, now)

    async def acquire_many_async(
        self, requests: Sequence[Request], now: float | datetime, lease_s: float, line: str = ""
    ) -> list[Admission]:
        """`acquire_many` for a caller on an event loop (module doc)."""
        todo, limited = _limited(requests)
        answers = await self._acquire_async(limited, _seconds(now), float(lease_s), line) if limited else []
        return _admissions(len(requests), todo, answers, now)

    def acquire(
        self,
        specs: Sequence[LimitSpec],
        holder: str,
        now: float | datetime,
        lease_s: float,
        reserver: str | None = None,
        turn: Turn = ANYONE,
        line: str = "",
    ) -> Admission:
        return self.acquire_many([(specs, holder, reserver or holder, turn)], now, lease_s, line)[0]

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

    def look(self, line: str, waiting: Sequence[Waiting], now: float | datetime) -> dict[str, Look]:
        """Record `line`'s waiting runs of each cap (replacing what it recorded before: a
        cap it leaves out, or with no runs, it waits for no more), charge the slots it
        handed on, and answer each cap as the line sees it (`Look`), by key."""
        return self._look(line, list(waiting), _seconds(now)) if waiting else {}

    async def look_async(
        self, line: str, waiting: Sequence[Waiting], now: float | datetime
    ) -> dict[str, Look]:
        """`look` for a caller on an event loop (module doc)."""
        return await self._look_async(line, list(waiting), _seconds(now)) if waiting else {}

    async def aclose(self) -> None:
        """Close what the `*_async` forms opened for the running loop (before it stops)."""
        return None  # the blocking forms on threads open nothing of the loop's

    # The loop's forms of the storage's operations: on a thread unless the storage
    # answers without blocking (an override).

    async def _acquire_async(
        self, requests: list[Limited], now: float, lease_s: float, line: str
    ) -> list[tuple[str, float] | None]:
        return await asyncio.to_thread(self._acquire, requests, now, lease_s, line)

    async def _look_async(self, line: str, waiting: list[Waiting], now: float) -> dict[str, Look]:
        return await asyncio.to_thread(self._look, line, waiting, now)

    async def _release_async(self, items: list[tuple[str, str]]) -> None:
        await asyncio.to_thread(self._release, items)

    async def _held_async(self, keys: list[str], now: float) -> list[int]:
        return await asyncio.to_thread(self._held, keys, now)

    @abstractmethod
    def _held(self, keys: list[str], now: float) -> list[int]:
        """For each spec key: how many slots are held by leases running past `now`."""

    @abstractmethod
    def _acquire(
        self, requests: list[Limited], now: float, lease_s: float, line: str
    ) -> list[tuple[str, float] | None]:
        """For each (specs, holder, reserver, turn): None when admitted, else (reason,
        retry time)."""

    @abstractmethod
    def _look(self, line: str, waiting: list[Waiting], now: float) -> dict[str, Look]:
        """`look`, for at least one cap."""

    @abstractmethod
    def _release(self, items: list[tuple[str, str]]) -> None:
        """Drop each (spec key, holder) slot."""

    @abstractmethod
    def _renew(self, items: list[tuple[str, str]], now: float, lease_s: float) -> None:
        """Set each existing (spec key, holder) slot to expire at now + lease_s."""


def _limited(requests: Sequence[Request]) -> tuple[list[int], list[Limited]]:
    """(the positions of the requests under some limit, those requests as (their limited
    specs, holder, reserver, turn)): requests without a limited spec are admitted
    without I/O."""
    todo: list[int] = []
    limited: list[Limited] = []
    for i, request in enumerate(requests):
        specs = tuple(s for s in request[0] if s.limited)
        if specs:
            todo.append(i)
            size = len(request)
            limited.append(
                (
                    specs,
                    request[1],
                    request[2] if size > 2 else request[1],  # type: ignore[misc]
                    request[3] if size > 3 else ANYONE,  # type: ignore[misc]
                )
            )
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
