"""Waiting in the worker for a concurrency slot (app.limits: a cap bounds calls in flight).

A run takes its concurrency slots on the calls' loop right before its call: a slot is
held for the call, not for the fenced start and the loop's queue too. A waiting run is
`running`, its lease kept by the heartbeat: a wait costs no registry write and expires
no lease (why each rule is so: docs/design.md, "Limits").

The `SlotGate` of a process (every method on its loop):

- `take` gives a run a slot parked in the process, or asks the limiter (the runs that
  ask during a round trip go together in the next). A run that finds a cap full waits
  in line behind this process's runs under the same caps, as an entry, not a task;
- `give` hands the slot of a call that ended, under the name it was admitted with, to
  the first run waiting under the same caps, in the same turn of the loop, while its
  lease holds past that run's first heartbeat, for HAND_OVER_FOR_S from admission at
  most; else it is `parked` PARK_S for the process's next run, unless those caps were
  found full in the last HAND_OVER_FOR_S;
- every POLL_S while runs wait (and when slots were given back) one read counts the
  free slots, and only that many runs ask again;
- a run still waiting after `wait_s` is put off: held back to the registry once, no
  attempt spent, with next_run_at at its expected turn (`expected_slot_at`);
- `release` gives slots back, those of one turn of the loop in one round trip.

Round trips run on the loop (`Limiter.*_async`), never on threads. Only caps are
asked for here: a run's rate is admitted before its start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app import metrics
from app.core.timefmt import utcnow

log = logging.getLogger("punctual.limits")

# The longest a run waits in the worker for a slot before it is held back (seconds).
MAX_WAIT_S = 2.0
# How often the runs waiting for a slot ask again for slots freed by other processes.
POLL_S = 0.01
# How long a slot may pass from call to call inside one process (since the limiter
# admitted it) before it goes back to the limiter for every process to compete for.
HAND_OVER_FOR_S = 1.0
# How long the slot of a call that ended stays with its process, unused, for the
# process's next run under the same caps, while those caps have room (SlotGate.give).
PARK_S = 0.05
# How many caps' last refusals a gate remembers before it forgets the old ones.
_FULL_KEPT = 4096


def wait_budget_s(lease_s: float) -> float:
    """How long a run may wait in the worker for a slot: MAX_WAIT_S, and a small part
    of the lease, since the run is claimed (leased) while it waits."""
    return min(MAX_WAIT_S, lease_s / 10)


def expected_slot_at(
    now: datetime, position: int, started_per_s: float, waited_s: float, max_concurrency: int
) -> datetime:
    """When a run still waiting for a slot should come back (pure).

    `position`: how many runs of this process wait ahead of it on the same cap;
    `started_per_s`: how fast this process's waiting runs got slots while it waited.
    With slots freeing at that pace, its turn comes after position + 1 of them; when
    none freed at all in `waited_s`, calls last longer than that, so each round of
    `max_concurrency` runs is expected to take at least as long again. A turn is never
    expected later than that: a pace read from a few slots in a wait the limiter
    itself stalled (Redis paused) would otherwise put runs minutes out.
    """
    rounds = position // max(1, max_concurrency) + 1
    no_slot_came = timedelta(seconds=max(waited_s, POLL_S) * rounds)
    if started_per_s > 0:
        return now + min(timedelta(seconds=(position + 1) / started_per_s), no_slot_came)
    return now + no_slot_came


def cap_keys(specs: Sequence) -> frozenset[str]:
    """The keys of the caps among a run's limit specs."""
    return frozenset(spec.key for spec in specs if spec.max_concurrency)


@dataclass
class Slot:
    """A concurrency slot a run holds: under which name the limiter knows it, since
    when (time.monotonic) it is this process's, and until when its lease is known to
    run at least."""

    holder: str
    since: float
    until: float


class _Waiter:
    """A run waiting for its slots: the item handed back to `start` or `put_off`, its
    cap specs and their keys, when it gives up (time.monotonic) and since when it waits."""

    __slots__ = ("item", "caps", "keys", "deadline", "since")

    def __init__(self, item: Any, caps: tuple, keys: frozenset[str], deadline: float, since: float):
        self.item = item
        self.caps = caps
        self.keys = keys
        self.deadline = deadline
        self.since = since


class SlotGate:
    """Where the runs of one process take their concurrency slots (module doc).

    A run that finds no slot at hand is not a task waiting on a future: it is an entry
    in its line, and its call's task is made once it has its slot. Waited on a future,
    each such run cost the loop a future, a suspended task and its wake-up more than a
    run that found its slot at once.

    Callbacks: `start(item, slot)` (on the loop) for a run that waited and got its
    slot; `put_off(items)` (on a thread) with (item, when its turn is expected) for
    the runs that waited their while; `name(item)` names the slot the limiter is
    asked to admit for a run (app.worker.engine.HolderNames).
    """

    def __init__(
        self,
        limiter,
        lease_s: float,
        margin_s: float,
        wait_s: float,
        start: Callable[[Any, Slot], None],
        put_off: Callable[[list[tuple[Any, datetime]]], None],
        name: Callable[[Any], str],
    ):
        self._limiter = limiter
        self._start = start
        self._put_off = put_off
        self._releasing: list[tuple[tuple, str]] = []  # (caps, holder) to give back this turn
        self._name = name
        self._lease_s = lease_s
        self._margin_s = margin_s  # a handed slot's lease must run this much longer
        self.wait_s = wait_s
        self._new: list[_Waiter] = []  # to be asked for in the next round trip
        self._asking: list[_Waiter] = []  # in the round trip under way
        self._lines: dict[frozenset[str], deque[_Waiter]] = {}  # waiting, by caps
        self._granted: dict[str, deque[float]] = {}  # cap key -> when waiters got a slot
        # Slots of ended calls kept for the next runs under the same caps: (slot, its
        # caps, when parked), the latest parked last (taken first).
        self._parked: dict[frozenset[str], list[tuple[Slot, tuple, float]]] = {}
        self._full_at: dict[frozenset[str], float] = {}  # caps -> when a run last found them full
        self._sweep: asyncio.TimerHandle | None = None
        self._driver: asyncio.Task | None = None
        self._nap: asyncio.Future | None = None  # the driver's wait between polls
        self._woken = False  # slots came back while the driver was not napping
        self._handed = 0  # slots handed over, not yet counted in the metric
        self._count_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        return len(self._new) + len(self._asking) + sum(len(line) for line in self._lines.values())

    def take(self, item: Any, caps: Sequence, keys: frozenset[str]) -> Slot | None:
        """The run's slot under every cap of `caps` (keys: `cap_keys(caps)`), if one is
        at hand; None: the run waits, and `start(item, slot)` is called when it has its
        slot, or it is put off after `wait_s`."""
        now = time.monotonic()
        slot = self._unpark(keys, now)
        if slot is not None:
            self._count_handed()
            return slot
        waiter = _Waiter(item, tuple(caps), keys, now + self.wait_s, now)
        line = self._lines.get(keys)
        if line:  # behind the runs of this process waiting already under these caps
            line.append(waiter)
        else:
            self._new.append(waiter)
        self._kick()
        return None

    def give(self, caps: Sequence, keys: frozenset[str], slot: Slot) -> bool:
        """A call under `caps` ended holding `slot`: hand it to the first run waiting
        under exactly the same caps, or park it for the next one while the caps have
        room. False: it goes back to the limiter."""
        now = time.monotonic()
        if not self._reusable(slot, now):
            return False
        line = self._lines.get(keys)
        if line:
            self._grant(line.popleft(), slot, now)
            self._count_handed()
            return True
        if now - self._full_at.get(keys, -math.inf) < HAND_OVER_FOR_S:
            return False  # the caps bind: the slot is for every process's runs
        self._parked.setdefault(keys, []).append((slot, tuple(caps), now))
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(PARK_S, self._unpark_idle)
        return True

    def _count_handed(self) -> None:
        """Count a slot handed over; the metric is written once a second, not per run
        (a metric shared by the worker's processes costs a lock and a write to a file)."""
        self._handed += 1
        if self._count_handle is None:
            self._count_handle = asyncio.get_running_loop().call_later(1.0, self._write_handed)

    def _write_handed(self) -> None:
        self._count_handle = None
        handed, self._handed = self._handed, 0
        if handed:
            metrics.SLOTS_HANDED_OVER.inc(handed)

    def _reusable(self, slot: Slot, now: float) -> bool:
        """Whether `slot` may go to another run of this process: its lease is known to run
        past that run's first heartbeat, and it was admitted less than HAND_OVER_FOR_S ago."""
        return slot.until > now + self._margin_s and now - slot.since < HAND_OVER_FOR_S

    def _unpark(self, keys: frozenset[str], now: float) -> Slot | None:
        """A parked slot for a run under exactly the caps `keys`, if one is still good."""
        parked = self._parked.get(keys)
        if not parked:
            return None
        found = None
        while parked and found is None:
            slot, caps, _ = parked.pop()
            if self._reusable(slot, now):
                found = slot
            else:
                self.release(caps, slot.holder)
        if not parked:
            del self._parked[keys]
        return found

    def _unpark_idle(self, everything: bool = False) -> None:
        """Give back the slots parked PARK_S ago or more, or that are no longer good."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        now = time.monotonic()
        back = []
        for keys in list(self._parked):
            kept = []
            for slot, caps, parked_at in self._parked[keys]:
                if everything or now - parked_at >= PARK_S or not self._reusable(slot, now):
                    back.append((caps, slot.holder))
                else:
                    kept.append((slot, caps, parked_at))
            if kept:
                self._parked[keys] = kept
            else:
                del self._parked[keys]
        for caps, holder in back:
            self.release(caps, holder)
        if self._parked and not everything:
            oldest = min(parked_at for kept in self._parked.values() for _, _, parked_at in kept)
            self._sweep = asyncio.get_running_loop().call_later(
                max(0.001, oldest + PARK_S - now), self._unpark_idle
            )

    def release(self, caps: Sequence, holder: str) -> None:
        """Give a slot back to the limiter: with the others given back in this turn of
        the loop, in one round trip on the loop (no thread: under a burst a thread hop
        left the slot idle while it waited for the GIL and the loop), after which the
        runs waiting here look for free slots at once. A failed release is only
        logged: the slot's lease runs out by itself."""
        self._releasing.append((tuple(caps), holder))
        if len(self._releasing) == 1:
            asyncio.get_running_loop().call_soon(self._give_back)

    def _give_back(self) -> None:
        batch, self._releasing = self._releasing, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._released(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _released(self, batch: list[tuple[tuple, str]]) -> None:
        try:
            await self._limiter.release_many_async(batch)
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(batch))
        self.wake()

    async def settled(self) -> None:
        """Give the parked slots back, and wait until they are and the runs put off so
        far are written back (the process stops taking runs)."""
        self._unpark_idle(everything=True)
        self._give_back()
        if self._count_handle is not None:
            self._count_handle.cancel()
            self._write_handed()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def wake(self) -> None:
        """Slots were given back by this process: look for free ones now, not at the poll."""
        if self._nap is not None and not self._nap.done():
            self._nap.set_result(None)
        else:
            self._woken = True

    def _kick(self) -> None:
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        elif self._nap is not None and not self._nap.done():
            self._nap.set_result(None)

    def _grant(self, waiter: _Waiter, slot: Slot, now: float) -> None:
        if now > waiter.since + POLL_S:  # it waited: count the pace slots come at
            for key in waiter.keys:
                self._granted.setdefault(key, deque()).append(now)
        self._start(waiter.item, slot)

    async def _drive(self) -> None:
        """Ask for the newcomers' slots, then for the waiting runs' as slots free, until
        nobody waits. Whatever fails, no waiter is left without an answer."""
        try:
            while True:
                if self._new:
                    batch, self._new = self._new, []
                    await self._ask(batch)
                    continue
                self._expire()
                if not self.waiting:
                    return
                if not self._woken:
                    await self._nap_for(POLL_S)
                self._woken = False
                if self._new:
                    continue
                await self._ask_free()
        except BaseException:
            log.exception("the slot gate failed; the runs waiting for a slot are put off")
            self._expire(everyone=True)
            raise
        finally:
            self._driver = None

    async def _nap_for(self, seconds: float) -> None:
        """Wait `seconds`, or less if woken (a newcomer, slots given back)."""
        loop = asyncio.get_running_loop()
        self._nap = nap = loop.create_future()
        timer = loop.call_later(seconds, _settle, nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None

    async def _ask(self, batch: list[_Waiter], again: bool = False) -> None:
        """One admission for `batch`; the runs not admitted wait in line (a run asked
        for again keeps its place at the front)."""
        asked = time.monotonic()
        holders = [self._name(w.item) for w in batch]
        self._asking = batch
        try:
            asks = [(w.caps, holder) for w, holder in zip(batch, holders, strict=True)]
            admissions = await self._limiter.acquire_many_async(asks, time.time(), self._lease_s)
        except Exception:  # the limiter is away: they wait (the polls ask again), or are put off in time
            log.exception("asking for the slots of %d runs failed", len(batch))
            admissions = [None] * len(batch)
        finally:
            self._asking = []
        now = time.monotonic()
        late: dict[frozenset[str], list[_Waiter]] = {}
        for waiter, holder, admission in zip(batch, holders, admissions, strict=True):
            if admission is not None and admission.admitted:
                # The slot's lease runs from the limiter's clock: a second less, for the
                # two clocks and the round trip.
                self._grant(waiter, Slot(holder, asked, asked + self._lease_s - 1.0), now)
            else:
                self._full_at[waiter.keys] = now
                late.setdefault(waiter.keys, []).append(waiter)
        for keys, waiters in late.items():
            line = self._lines.setdefault(keys, deque())
            if again:
                line.extendleft(reversed(waiters))
            else:
                line.extend(waiters)
            # Slots parked while these runs were being asked for are theirs.
            while line and keys in self._parked:
                kept = self._unpark(keys, now)
                if kept is None:
                    break
                self._grant(line.popleft(), kept, now)
                self._count_handed()
        if len(self._full_at) > _FULL_KEPT:  # caps of targets long quiet
            self._full_at = {k: at for k, at in self._full_at.items() if now - at < HAND_OVER_FOR_S}

    async def _ask_free(self) -> None:
        """Ask again for as many waiting runs as their caps have free slots."""
        caps = {
            spec.key: spec.max_concurrency for line in self._lines.values() if line for spec in line[0].caps
        }
        try:
            free = await self._limiter.free_slots_async(caps, time.time())
        except Exception:
            log.warning("counting free slots failed", exc_info=True)
            return
        ready: list[_Waiter] = []
        tries = runs_to_try({keys: len(line) for keys, line in self._lines.items()}, free)
        for keys, count in tries.items():
            line = self._lines[keys]
            ready += (line.popleft() for _ in range(count))
        if ready:
            await self._ask(ready, again=True)

    def _expire(self, everyone: bool = False) -> None:
        """Put off the runs that waited their while (all of them: `everyone`)."""
        now = time.monotonic()
        expired: list[_Waiter] = []
        for keys in list(self._lines):
            line = self._lines[keys]
            while line and (everyone or line[0].deadline <= now):
                expired.append(line.popleft())
            if not line:
                del self._lines[keys]
        if everyone:
            expired += self._new + self._asking
            self._new, self._asking = [], []
        for granted in self._granted.values():
            while granted and granted[0] < now - self.wait_s:
                granted.popleft()
        if not expired:
            return
        at = utcnow()
        positions: dict[str, int] = {}
        put_off = []
        for waiter in expired:
            cap = min(waiter.caps, key=lambda spec: spec.max_concurrency)
            pace = len(self._granted.get(cap.key, ())) / self.wait_s
            position = positions.get(cap.key, 0)
            positions[cap.key] = position + 1
            put_off.append(
                (waiter.item, expected_slot_at(at, position, pace, now - waiter.since, cap.max_concurrency))
            )
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._put_off, put_off))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _settle(nap: asyncio.Future) -> None:
    if not nap.done():
        nap.set_result(None)


def runs_to_try(waiting: dict[frozenset[str], int], free: dict[str, int]) -> dict[frozenset[str], int]:
    """How many of each line's waiting runs to ask for again (pure): `waiting` maps a
    line's caps (their keys) to the runs in it, `free` a cap key to its free slots.
    Lines are served in order, each as many runs as every one of its caps still has
    free slots for; a line gets none while one of its caps has none left."""
    budget = dict(free)
    tries = {}
    for keys, count in waiting.items():
        n = min([count, *(budget.get(key, 0) for key in keys)])
        if n > 0:
            tries[keys] = n
            for key in keys:
                budget[key] -= n
    return tries
