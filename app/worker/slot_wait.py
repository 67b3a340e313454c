"""Waiting in the worker for a concurrency slot (app.limits: a cap bounds calls in flight).

A run takes its concurrency slots on the calls' loop, right before its call, not
before its start: a slot is held for the call and the few milliseconds around it,
not for the fenced start and the loop's queue as well (held from the admission, a
slot of a 1 ms call was taken for 120-140 ms, and the default cap of 200 became
about 1,500 calls a second, bench/README.md 2026-12-03). The run is `running` while
it waits, its lease kept by the heartbeat like any call in flight, so a wait costs
no registry write and expires no lease.

The `SlotGate` of a process (every method on its loop):

- `take` asks the limiter for a run's slots. The runs that ask while a round trip is
  under way go together in the next one, so a message's runs cost one script call.
  A run that finds a cap full waits in line, behind the runs of this process that
  wait under the same caps (first come, first served);
- `give` hands the slot of a call that ended straight to the first run waiting under
  exactly the same caps: no release, no poll, no admission, no start, so behind a
  full cap the next call starts in the same turn of the loop. The slot keeps the
  name it was admitted under: the limiter sees one slot held all along, renewed by
  the heartbeat of whichever run uses it and released by the last. It is handed on
  only while its lease is known to run past the next run's first heartbeat, and for
  at most HAND_OVER_FOR_S since its admission; then it goes back to the limiter,
  where the runs waiting in other processes compete for it;
- when nobody in the process waits for it, the slot of a call that ended is kept
  (`parked`) for at most PARK_S, for the process's next run under the same caps: a
  burst's runs come to the loop in waves of a message's worth, and each run asked
  Redis for a slot and gave it back, two round trips a run to a cap that had room
  all along. A slot is parked only while no run of the process found those caps
  full in the last HAND_OVER_FOR_S: behind a cap that binds, a call's slot goes back
  at once, for the runs of every process;
- every POLL_S while runs wait (and as soon as this process gave slots back), one
  read counts the free slots of the caps waited for (`Limiter.free_slots`), and only
  as many waiting runs as that are asked for again, in one script call;
- a run still waiting after `wait_s` (a second or two) is put off: held back to the
  registry once, no attempt spent, with next_run_at when its turn is expected at the
  pace slots came to the runs waiting here (`expected_slot_at`).

A run's rate is not the gate's: it is admitted before the run's start (a rate must
see each start and hold a run back before it is started), so only the caps are
asked for here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from app import metrics
from app.core.timefmt import utcnow
from app.registry.transient import retrying

log = logging.getLogger("punctual.limits")

# The longest a run waits in the worker for a slot before it is held back (seconds).
MAX_WAIT_S = 2.0
# How often the runs waiting for a slot ask again for slots freed by other processes.
POLL_S = 0.01
# How long the releaser lets slots of ending calls gather before one round trip gives
# them back (SlotReleaser).
RELEASE_LINGER_S = 0.005
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


@dataclass
class _Waiter:
    """A run asking for its slots: what the gate hands back to `put_off`, its cap
    specs, the name its slots get, and when it gives up waiting (time.monotonic)."""

    item: Any
    caps: tuple
    keys: frozenset[str]
    holder: str
    deadline: float
    since: float
    future: asyncio.Future = field(repr=False)


class SlotGate:
    """Where the runs of one process take their concurrency slots (module doc).

    `put_off(items)` is called on a thread with (item, when its turn is expected)
    for the runs that waited their while; `take` answers None for those.
    `release(items)` gives (caps, holder) slots back without blocking (a
    SlotReleaser's put_many).
    """

    def __init__(
        self,
        limiter,
        lease_s: float,
        margin_s: float,
        wait_s: float,
        put_off: Callable[[list[tuple[Any, datetime]]], None],
        release: Callable[[list], None],
    ):
        self._limiter = limiter
        self._release = release  # (caps, holder) items; must not block
        self._lease_s = lease_s
        self._margin_s = margin_s  # a handed slot's lease must run this much longer
        self.wait_s = wait_s
        self._put_off = put_off
        self._new: list[_Waiter] = []  # to be asked for in the next round trip
        self._lines: dict[frozenset[str], deque[_Waiter]] = {}  # waiting, by caps
        self._granted: dict[str, deque[float]] = {}  # cap key -> when waiters got a slot
        # Slots of ended calls kept for the next runs under the same caps: (slot, its
        # caps, when parked), the latest parked last (taken first).
        self._parked: dict[frozenset[str], list[tuple[Slot, tuple, float]]] = {}
        self._full_at: dict[frozenset[str], float] = {}  # caps -> when a run last found them full
        self._sweep: asyncio.TimerHandle | None = None
        self._driver: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        return len(self._new) + sum(len(line) for line in self._lines.values())

    async def take(self, caps: Sequence, holder: str, item: Any) -> Slot | None:
        """The run's slot under every cap of `caps` (all at once), or None: it waited
        `wait_s` and is put off."""
        now = time.monotonic()
        keys = cap_keys(caps)
        slot = self._unpark(keys, now)
        if slot is not None:
            metrics.SLOTS_HANDED_OVER.inc()
            return slot
        waiter = _Waiter(
            item,
            tuple(caps),
            keys,
            holder,
            now + self.wait_s,
            now,
            asyncio.get_running_loop().create_future(),
        )
        line = self._lines.get(keys)
        if line:  # behind the runs of this process waiting already under these caps
            line.append(waiter)
        else:
            self._new.append(waiter)
        self._kick()
        return await waiter.future

    def give(self, caps: Sequence, slot: Slot) -> bool:
        """A call under `caps` ended holding `slot`: hand it to the first run waiting
        under exactly the same caps, or park it for the next one while the caps have
        room. False: it goes back to the limiter."""
        now = time.monotonic()
        if not self._reusable(slot, now):
            return False
        keys = cap_keys(caps)
        line = self._lines.get(keys)
        while line:
            waiter = line.popleft()
            if not waiter.future.done():  # (a cancelled waiter is skipped)
                self._grant(waiter, slot, now)
                metrics.SLOTS_HANDED_OVER.inc()
                return True
        if now - self._full_at.get(keys, -math.inf) < HAND_OVER_FOR_S:
            return False  # the caps bind: the slot is for every process's runs
        self._parked.setdefault(keys, []).append((slot, tuple(caps), now))
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(PARK_S, self._unpark_idle)
        return True

    def _reusable(self, slot: Slot, now: float) -> bool:
        """Whether `slot` may go to another run of this process: its lease is known to run
        past that run's first heartbeat, and it was admitted less than HAND_OVER_FOR_S ago."""
        return slot.until > now + self._margin_s and now - slot.since < HAND_OVER_FOR_S

    def _unpark(self, keys: frozenset[str], now: float) -> Slot | None:
        """A parked slot for a run under exactly the caps `keys`, if one is still good."""
        parked = self._parked.get(keys)
        found = None
        while parked and found is None:
            slot, caps, _ = parked.pop()
            if self._reusable(slot, now):
                found = slot
            else:
                self._release([(caps, slot.holder)])
        if parked is not None and not parked:
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
        if back:
            self._release(back)
        if self._parked and not everything:
            oldest = min(parked_at for kept in self._parked.values() for _, _, parked_at in kept)
            self._sweep = asyncio.get_running_loop().call_later(
                max(0.001, oldest + PARK_S - now), self._unpark_idle
            )

    async def settled(self) -> None:
        """Give the parked slots back, and wait until the runs put off so far are
        written back (the process stops taking runs)."""
        self._unpark_idle(everything=True)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def wake(self) -> None:
        """Slots were given back by this process: look for free ones now, not at the poll."""
        if self._wake is not None:
            self._wake.set()

    def _kick(self) -> None:
        if self._driver is None:
            self._wake = asyncio.Event()
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        elif self._new and self._wake is not None:
            self._wake.set()

    def _grant(self, waiter: _Waiter, slot: Slot, now: float) -> None:
        if now > waiter.since + POLL_S:  # it waited: count the pace slots come at
            for key in waiter.keys:
                self._granted.setdefault(key, deque()).append(now)
        waiter.future.set_result(slot)

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
                assert self._wake is not None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_S)
                if self._new:
                    continue
                await self._ask_free()
        except BaseException:
            log.exception("the slot gate failed; the runs waiting for a slot are put off")
            self._expire(everyone=True)
            raise
        finally:
            self._driver = None

    async def _ask(self, batch: list[_Waiter], again: bool = False) -> None:
        """One admission for `batch`; the runs not admitted wait in line (a run asked
        for again keeps its place at the front)."""
        asked = time.monotonic()
        try:
            admissions = await asyncio.to_thread(
                retrying,
                lambda: self._limiter.acquire_many(
                    [(w.caps, w.holder) for w in batch], time.time(), self._lease_s
                ),
                f"slots of {len(batch)} runs",
            )
        except Exception:  # the limiter stayed away: they wait, and are put off in time
            log.exception("asking for the slots of %d runs failed", len(batch))
            admissions = [None] * len(batch)
        now = time.monotonic()
        late = []
        for waiter, admission in zip(batch, admissions, strict=True):
            if admission is not None and admission.admitted:
                # The slot's lease runs from the limiter's clock: a second less, for the
                # two clocks and the round trip.
                slot = Slot(waiter.holder, asked, asked + self._lease_s - 1.0)
                if waiter.future.done():  # cancelled meanwhile: its slot goes straight back
                    self._release([(waiter.caps, slot.holder)])
                else:
                    self._grant(waiter, slot, now)
            else:
                self._full_at[waiter.keys] = now
                if not waiter.future.done():
                    late.append(waiter)
        by_line: dict[frozenset[str], list[_Waiter]] = {}
        for waiter in late:
            by_line.setdefault(waiter.keys, []).append(waiter)
        for keys, waiters in by_line.items():
            line = self._lines.setdefault(keys, deque())
            if again:
                line.extendleft(reversed(waiters))
            else:
                line.extend(waiters)
            # Slots parked while these runs were being asked for are theirs.
            while line and keys in self._parked:
                waiter = line.popleft()
                if waiter.future.done():  # (a cancelled waiter is skipped)
                    continue
                kept = self._unpark(keys, now)
                if kept is None:
                    line.appendleft(waiter)
                    break
                self._grant(waiter, kept, now)
                metrics.SLOTS_HANDED_OVER.inc()
        if len(self._full_at) > _FULL_KEPT:  # caps of targets long quiet
            self._full_at = {k: at for k, at in self._full_at.items() if now - at < HAND_OVER_FOR_S}

    async def _ask_free(self) -> None:
        """Ask again for as many waiting runs as their caps have free slots."""
        caps = {
            spec.key: spec.max_concurrency for line in self._lines.values() if line for spec in line[0].caps
        }
        try:
            free = await asyncio.to_thread(self._limiter.free_slots, caps, time.time())
        except Exception:
            log.warning("counting free slots failed", exc_info=True)
            return
        ready: list[_Waiter] = []
        for line in self._lines.values():
            picked, _ = pick_runs([(w, w.caps) for w in line], free)
            for waiter, _caps in picked:
                line.remove(waiter)
                for spec in waiter.caps:
                    free[spec.key] -= 1
                ready.append(waiter)
        if ready:
            await self._ask(ready, again=True)

    def _expire(self, everyone: bool = False) -> None:
        """Put off the runs that waited their while (all of them: `everyone`)."""
        now = time.monotonic()
        expired: list[_Waiter] = []
        for keys in list(self._lines):
            line = self._lines[keys]
            while line and (everyone or line[0].deadline <= now or line[0].future.done()):
                waiter = line.popleft()
                if not waiter.future.done():
                    expired.append(waiter)
            if not line:
                del self._lines[keys]
        if everyone:
            expired += [w for w in self._new if not w.future.done()]
            self._new = []
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
            waiter.future.set_result(None)
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._put_off, put_off))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def pick_runs(waiting: list, free: dict[str, int]) -> tuple[list, list]:
    """(runs to try now, runs left waiting): in order, a run whose every cap still has
    a free slot in `free` (cap key -> free slots) is tried and takes one of each."""
    budget = dict(free)
    now, later = [], []
    for entry in waiting:
        keys = [spec.key for spec in entry[1] if spec.max_concurrency]
        if all(budget.get(key, 0) > 0 for key in keys):
            for key in keys:
                budget[key] -= 1
            now.append(entry)
        else:
            later.append(entry)
    return now, later


class SlotReleaser:
    """Gives concurrency slots back as calls end, batched, then says how many.

    Calls `put` what they hold; one thread releases everything queued so far in one
    round trip (`release`), then calls `released(count)` (the gate looks for free
    slots at once). A failed release is only logged: the slots' leases run out by
    themselves.
    """

    def __init__(self, release: Callable[[list], None], released: Callable[[int], None]):
        self._release = release
        self._released = released
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="slot-releaser", daemon=True)
        self._thread.start()

    def put(self, item) -> None:
        self._queue.put(item)

    def put_many(self, items: Iterable) -> None:
        for item in items:
            self._queue.put(item)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            items, stopping = ([] if first is None else [first]), first is None
            if not stopping:
                # Let the calls ending meanwhile join this round trip: a slot comes back
                # at most RELEASE_LINGER_S later, and a burst's releases travel by the
                # dozen.
                time.sleep(RELEASE_LINGER_S)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    items.append(item)
            if items:
                try:
                    self._release(items)
                except Exception:  # a slot's lease runs out on its own
                    log.exception("releasing %d concurrency slots failed", len(items))
                self._released(len(items))
            if stopping:
                return
