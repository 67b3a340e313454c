"""Waiting in the worker for a concurrency slot (app.limits: a cap bounds calls in flight).

A run takes its concurrency slots on the calls' loop right before its call, not before
its start, so a slot is held for the call and little else. It waits `running`, its
lease kept by the heartbeat like a call in flight: a wait costs no registry write (why
each rule is so: docs/design.md, "Limits").

The `SlotGate` of a process (every method on its loop):

- `take`: a slot parked in the process, or an admission asked of the limiter with the
  runs that ask meanwhile (one script call a message); a run that finds a cap full
  waits in its line, an entry, not a task, until `start(item, slot)`;
- the lines serve their runs in turns (app.limits.line: recurring runs first, then the
  owners by weighted start-time fair queueing), and the gate is one line of the
  limiter's: every POLL_S while runs wait, a `Limiter.look` records them, reports the
  slots handed on, says how many of each owner's runs may take a free slot (those are
  asked for again) and which owners waiting in other processes come first;
- `give`: the slot of a call that ended goes straight to the run next in turn under the
  same caps (no round trip); back to the limiter when the turn is an owner of another
  process or the slot was passed on for HAND_OVER_FOR_S; parked for PARK_S for the
  process's next run while the caps have room;
- a run still waiting after `wait_s` is put off: held back to the registry once, no
  attempt spent, until its turn is expected (`expected_slot_at`);
- `release`: the slots given back in one turn of the loop go in one round trip (on
  the loop, as every round trip here, never on a thread).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from app import metrics
from app.core.timefmt import utcnow
from app.limits.limiter import Waiting
from app.limits.line import ANYONE, RECURRING, Ahead, Tags, Turn, order

log = logging.getLogger("punctual.limits")

# The longest a run waits in the worker for a slot before it is held back (seconds).
MAX_WAIT_S = 2.0
# How often the runs waiting for a slot look at their caps again (Limiter.look) for
# slots freed by other processes.
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
    cap specs and their keys, its turn, when it gives up (time.monotonic) and since when
    it waits."""

    __slots__ = ("item", "caps", "keys", "turn", "deadline", "since")

    def __init__(
        self, item: Any, caps: tuple, keys: frozenset[str], turn: Turn, deadline: float, since: float
    ):
        self.item = item
        self.caps = caps
        self.keys = keys
        self.turn = turn
        self.deadline = deadline
        self.since = since


class _Line:
    """The runs of a process waiting under the same caps: by flow (app.limits.line),
    each flow's first come, first served."""

    __slots__ = ("caps", "flows", "size")

    def __init__(self, caps: tuple):
        self.caps = caps  # the specs, for their max_concurrency
        self.flows: dict[str, deque[_Waiter]] = {}
        self.size = 0

    def push(self, waiter: _Waiter) -> None:
        queue = self.flows.get(waiter.turn.flow)
        if queue is None:
            queue = self.flows[waiter.turn.flow] = deque()
        queue.append(waiter)
        self.size += 1

    def push_front(self, waiters: list[_Waiter]) -> None:
        """Runs asked for again and refused: back at the front of their flows, in order."""
        for waiter in reversed(waiters):
            queue = self.flows.get(waiter.turn.flow)
            if queue is None:
                queue = self.flows[waiter.turn.flow] = deque()
            queue.appendleft(waiter)
        self.size += len(waiters)

    def pop(self, flow: str) -> _Waiter:
        queue = self.flows[flow]
        waiter = queue.popleft()
        if not queue:
            del self.flows[flow]
        self.size -= 1
        return waiter

    def expired(self, now: float, everyone: bool) -> list[_Waiter]:
        """Take out the runs whose wait ended by `now` (all: `everyone`)."""
        out: list[_Waiter] = []
        for flow in list(self.flows):
            queue = self.flows[flow]
            while queue and (everyone or queue[0].deadline <= now):
                out.append(queue.popleft())
            if not queue:
                del self.flows[flow]
        self.size -= len(out)
        return out

    def counts(self) -> dict[Turn, int]:
        return {queue[0].turn: len(queue) for queue in self.flows.values()}


class _Seen:
    """A cap as this process last saw it (`Limiter.look`): its clocks and the finish
    tags of the process's flows, and the flows waiting in other processes, first in
    turn first; both moved on by the process's own decisions until the next look."""

    __slots__ = ("free", "tags", "ahead")

    def __init__(self, free: int | None, tags: Tags, ahead: list[Ahead]):
        self.free = free  # None: not looked at yet
        self.tags = tags
        self.ahead = ahead

    def first_ahead(self) -> Ahead | None:
        while self.ahead and self.ahead[0].runs <= 0:
            self.ahead.pop(0)
        return self.ahead[0] if self.ahead else None

    def give_ahead(self, first: Ahead) -> None:
        """A slot went back to the limiter for `first`, the flow waiting elsewhere."""
        first.runs -= 1
        first.start += 1 / first.weight
        self.ahead.sort(key=Ahead.order)


class SlotGate:
    """Where the runs of one process take their concurrency slots (module doc).

    A run that finds no slot at hand is not a task waiting on a future: it is an entry
    in its line, and its call's task is made once it has its slot. Waited on a future,
    each such run cost the loop a future, a suspended task and its wake-up more than a
    run that found its slot at once.

    Callbacks: `start(item, slot)` (on the loop) for a run that waited and got its
    slot; `put_off(items)` (on a thread) with (item, when its turn is expected) for
    the runs that waited their while; `name(item)` names the slot the limiter is
    asked to admit for a run (app.worker.engine.HolderNames); `in_line(item)` (on the
    loop) for a run that found its caps full and joins their line.
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
        in_line: Callable[[Any], None] = lambda item: None,
    ):
        self._limiter = limiter
        self._in_line = in_line
        self._start = start
        self._put_off = put_off
        self._releasing: list[tuple[tuple, str]] = []  # (caps, holder) to give back this turn
        self._name = name
        self._lease_s = lease_s
        self._margin_s = margin_s  # a handed slot's lease must run this much longer
        self.wait_s = wait_s
        self._line_name = ""  # this process's line at the limiter (drawn in the process that uses it)
        self._line_pid = 0
        self._new: list[_Waiter] = []  # to be asked for in the next round trip
        self._asking: list[_Waiter] = []  # in the round trip under way
        self._lines: dict[frozenset[str], _Line] = {}  # waiting, by caps
        self._granted: dict[str, deque[float]] = {}  # cap key -> when waiters got a slot
        # Slots of ended calls kept for the next runs under the same caps: (slot, its
        # caps, when parked), the latest parked last (taken first).
        self._parked: dict[frozenset[str], list[tuple[Slot, tuple, float]]] = {}
        self._full_at: dict[frozenset[str], float] = {}  # caps -> when a run last found them full
        # The caps waited for, as the last look saw them, and those where other processes'
        # runs wait (`_Seen.ahead`); the caps this process's runs are recorded waiting for
        # at the limiter, with their max_concurrency; the slots handed on since the last
        # look, by cap key and turn.
        self._seen: dict[str, _Seen] = {}
        self._contended: set[str] = set()
        self._recorded: dict[str, int] = {}
        self._served: dict[str, tuple[int, dict[str, tuple[Turn, int]]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._driver: asyncio.Task | None = None
        self._nap: asyncio.Future | None = None  # the driver's wait between polls
        self._woken = False  # slots came back while the driver was not napping
        self._handed = 0  # slots handed over, not yet counted in the metric
        self._count_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        return len(self._new) + len(self._asking) + sum(line.size for line in self._lines.values())

    @property
    def line(self) -> str:
        """This process's name as a line of the limiter's: unique to the process."""
        if self._line_pid != os.getpid():  # drawn anew in a forked child
            self._line_pid, self._line_name = os.getpid(), f"{os.getpid()}.{secrets.token_hex(4)}"
        return self._line_name

    def take(self, item: Any, caps: Sequence, keys: frozenset[str], turn: Turn = ANYONE) -> Slot | None:
        """The run's slot under every cap of `caps` (keys: `cap_keys(caps)`), if one is
        at hand; None: the run waits, and `start(item, slot)` is called when it has its
        slot, or it is put off after `wait_s`. `turn`: whose turn it takes in the line."""
        now = time.monotonic()
        slot = self._unpark(keys, now)
        if slot is not None:
            self._count_handed()
            return slot
        waiter = _Waiter(item, tuple(caps), keys, turn, now + self.wait_s, now)
        line = self._lines.get(keys)
        if line is not None and line.size:  # with the runs of this process waiting under these caps
            queue = line.flows.get(turn.flow)
            if queue is None:
                queue = line.flows[turn.flow] = deque()
            queue.append(waiter)
            line.size += 1
            self._in_line(item)
            # (No look for it now: the caps were full a moment ago, and the next slot
            # that ends here, or the next poll, serves the line in turn.)
            if self._driver is None:
                self._kick()
        else:
            self._new.append(waiter)
            self._kick()
        return None

    def give(self, caps: Sequence, keys: frozenset[str], slot: Slot) -> bool:
        """A call under `caps` ended holding `slot`: hand it to the run of this process
        waiting under exactly the same caps whose turn it is, or park it for the next one
        while the caps have room. False: it goes back to the limiter (for a run of
        another process, whose turn it may be).

        Handed on, the slot keeps the name it was admitted under: the limiter sees one
        slot held all along, renewed by the heartbeat of whichever run uses it and
        released by the last; no release, poll, admission or start, so behind a full cap
        the next call starts in the same turn of the loop. It is handed on only while
        its lease is known to run past the next run's first heartbeat, and for at most
        HAND_OVER_FOR_S since its admission, then the runs of every process take their
        turns for it. Parked, it spares a burst's runs, which come in waves of a
        message's worth, two round trips each to a cap that had room all along; it is
        parked only while no run of the process found those caps full in the last
        HAND_OVER_FOR_S, so a cap that binds gets its slots back at once."""
        now = time.monotonic()
        if not self._reusable(slot, now):
            return False
        line = self._lines.get(keys)
        if line is not None and line.size:
            flows = line.flows
            if len(flows) == 1 and (not self._contended or keys.isdisjoint(self._contended)):
                # One owner waits here and none elsewhere: no turn to keep, nothing to charge.
                queue = next(iter(flows.values()))
                waiter = queue.popleft()
                line.size -= 1
                if not queue:
                    del self._lines[keys]
            else:
                turn = self._next(keys, line)
                if not line.size:
                    del self._lines[keys]
                if turn is None:
                    return False  # an owner waiting in another process goes first
                waiter = turn
            self._grant(waiter, slot, now)
            self._count_handed()
            return True
        if now - self._full_at.get(keys, -math.inf) < HAND_OVER_FOR_S:
            return False  # the caps bind: the slot is for every process's runs
        self._parked.setdefault(keys, []).append((slot, tuple(caps), now))
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(PARK_S, self._unpark_idle)
        return True

    def _next(self, keys: frozenset[str], line: _Line) -> _Waiter | None:
        """Take out the run of `line` whose turn it is for a slot under `keys`, or None
        when the turn is a flow waiting in another process (the slot is then counted as
        that flow's until the next look says otherwise). Under several caps a flow
        stands where its latest start puts it. (Written out, not with app.limits.line's
        helpers: under contention this runs for every call that ends.)"""
        caps = []
        for key in keys:
            cap = self._seen.get(key)
            if cap is None:  # not looked at yet: this process's own turns until then
                cap = self._seen[key] = _Seen(None, Tags(), [])
            caps.append(cap.tags)
        first, best = "", (2, 0.0, "")
        for flow in line.flows:
            lane = flow[0]
            start = 0.0
            for tags in caps:
                begin = tags.finish.get(flow, 0.0)
                clock = tags.clock.get(lane, 0.0)
                start = max(start, begin if begin > clock else clock)
            standing = (0 if lane == RECURRING else 1, start, flow)
            if standing < best:
                first, best = flow, standing
        for key in keys:
            cap = self._seen[key]
            ahead = cap.first_ahead()
            if ahead is not None and ahead.order() < order(first, cap.tags):
                cap.give_ahead(ahead)
                return None
        waiter = line.pop(first)
        turn = waiter.turn
        lane = first[0]
        for tags in caps:
            begin = max(tags.finish.get(first, 0.0), tags.clock.get(lane, 0.0))
            tags.finish[first] = begin + 1 / turn.weight
            tags.clock[lane] = max(tags.clock.get(lane, 0.0), begin)
        for spec in line.caps:
            if spec.max_concurrency:
                served = self._served.get(spec.key)
                if served is None:
                    served = self._served[spec.key] = (spec.max_concurrency, {})
                counted = served[1].get(first)
                served[1][first] = (turn, counted[1] + 1) if counted else (turn, 1)
        return waiter

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
            self._background(self._released(batch))

    def _background(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
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
        nobody waits; then tell the limiter this process waits no more. Whatever fails,
        no waiter is left without an answer."""
        try:
            while True:
                if self._new:
                    batch, self._new = self._new, []
                    await self._ask(batch)
                    continue
                self._expire()
                if not self.waiting:
                    if self._recorded or self._served:
                        await self._look()
                        if self.waiting:
                            continue
                    self._seen, self._contended = {}, set()
                    return
                if not self._woken:
                    await self._nap_for(POLL_S)
                self._woken = False
                if self._new:
                    continue
                await self._look()
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
        for again keeps its place at the front of its flow)."""
        asked = time.monotonic()
        holders = [self._name(w.item) for w in batch]
        self._asking = batch
        try:
            asks = [(w.caps, holder, holder, w.turn) for w, holder in zip(batch, holders, strict=True)]
            admissions = await self._limiter.acquire_many_async(asks, time.time(), self._lease_s, self.line)
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
                if not again:
                    self._in_line(waiter.item)
        for keys, waiters in late.items():
            line = self._lines.get(keys)
            if line is None:
                line = self._lines[keys] = _Line(waiters[0].caps)
            if again:
                line.push_front(waiters)
            else:
                for waiter in waiters:
                    line.push(waiter)
            # Slots parked while these runs were being asked for are theirs, in turn.
            while line.size and keys in self._parked:
                kept = self._unpark(keys, now)
                if kept is None:
                    break
                turn_of = self._next(keys, line)
                if turn_of is None:
                    self.release(waiters[0].caps, kept.holder)
                    break
                self._grant(turn_of, kept, now)
                self._count_handed()
            if not line.size:
                del self._lines[keys]
        if len(self._full_at) > _FULL_KEPT:  # caps of targets long quiet
            self._full_at = {k: at for k, at in self._full_at.items() if now - at < HAND_OVER_FOR_S}

    async def _look(self) -> None:
        """Tell the limiter which runs wait here and which slots were handed on, and ask
        again for as many waiting runs of each flow as the look says may take a slot."""
        waiting = self._waiting()
        served, self._served = self._served, {}
        try:
            looks = await self._limiter.look_async(self.line, waiting, time.time())
        except Exception:  # the slots handed on are told at the next look
            log.warning("looking at the caps waited for failed", exc_info=True)
            for key, (cap, flows) in served.items():
                _, now_served = self._served.setdefault(key, (cap, {}))
                for flow, (turn, count) in flows.items():
                    now_served[flow] = (turn, now_served.get(flow, (turn, 0))[1] + count)
            return
        self._recorded = {item.key: item.max_concurrency for item in waiting if item.runs}
        self._seen = {key: _Seen(look.free, look.tags, list(look.ahead)) for key, look in looks.items()}
        self._contended = {key for key, look in looks.items() if look.ahead}
        lines = self._lines
        tries = runs_to_try(
            {keys: {flow: len(queue) for flow, queue in line.flows.items()} for keys, line in lines.items()},
            {key: look.grants for key, look in looks.items()},
        )
        ready: list[_Waiter] = []
        for (keys, flow), count in tries.items():
            line = self._lines[keys]
            ready += (line.pop(flow) for _ in range(count))
            if not line.size:
                del self._lines[keys]
        if ready:
            await self._ask(ready, again=True)

    def _waiting(self) -> list[Waiting]:
        """What this process tells the limiter at a look: for each cap its runs wait for,
        how many of each turn, and the slots it handed on. A line's runs count for a cap
        unless another cap of theirs was full at the last look while this one was not:
        they wait for that one first, and must not hold this one's slots back from
        the owners of other processes meanwhile."""
        caps = dict(self._recorded)  # a cap no run waits for any more: its record is dropped
        runs: dict[str, dict[Turn, int]] = {}
        for keys, line in self._lines.items():
            full = {key for key in keys if (seen := self._seen.get(key)) is not None and seen.free == 0}
            counts = line.counts()
            for spec in line.caps:
                caps[spec.key] = spec.max_concurrency
                if full and spec.key not in full:
                    continue
                found = runs.setdefault(spec.key, {})
                for turn, count in counts.items():
                    found[turn] = found.get(turn, 0) + count
        for key, (cap, _) in self._served.items():
            caps.setdefault(key, cap)
        served = {key: dict(flows.values()) for key, (_, flows) in self._served.items()}
        return [Waiting(key, cap, runs.get(key, {}), served.get(key, {})) for key, cap in caps.items()]

    def _expire(self, everyone: bool = False) -> None:
        """Put off the runs that waited their while (all of them: `everyone`)."""
        now = time.monotonic()
        expired: list[_Waiter] = []
        for keys in list(self._lines):
            line = self._lines[keys]
            expired += line.expired(now, everyone)
            if not line.size:
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
        self._background(asyncio.to_thread(self._put_off, put_off))


def _settle(nap: asyncio.Future) -> None:
    if not nap.done():
        nap.set_result(None)


def runs_to_try(
    waiting: dict[frozenset[str], dict[str, int]], grants: dict[str, dict[str, int]]
) -> dict[tuple[frozenset[str], str], int]:
    """How many of each line's waiting runs of each flow to ask for again (pure):
    `waiting` maps a line's caps (their keys) to its runs by flow, `grants` a cap key to
    how many runs of each flow may take one of its free slots now. Lines are served in
    order, each flow as many runs as every one of its caps still grants it; none while
    one of its caps grants it none (or was not looked at)."""
    budget = {key: dict(flows) for key, flows in grants.items()}
    tries = {}
    for keys, flows in waiting.items():
        for flow, count in flows.items():
            n = min([count, *(budget.get(key, {}).get(flow, 0) for key in keys)])
            if n > 0:
                tries[(keys, flow)] = n
                for key in keys:
                    budget[key][flow] -= n
    return tries
