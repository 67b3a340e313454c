"""The dispatcher: a worker process's engine for starting runs and calling targets.

`dispatch(batch)` (called by the Celery dispatch task) does, for a batch of runs:

1. rates: one `acquire_many` for the batch's rates (app.limits). A run held by a rate
   is put off until then (app.lifecycle.lease.hold: one registry write, no attempt);
2. start: one fenced write for the admitted runs; a run it does not return was started
   already (a duplicated message) or lost its lease: nothing is called;
3. call: each started run goes to the process's event loop (app.worker.event_loop),
   a run claimed ahead on a timer until its instant. Under a cap it takes its slot
   there (app.worker.slot_wait), waiting in the cap's line, `running`, its lease kept
   by the heartbeat, and is put off to the registry once after a second or two. A
   call's slots go back the moment it ends; its completion is written in batches by
   the completion buffer. What blocks (a lease renewal, an owner's secrets, a queue
   publish) runs on the loop's threads;
4. lease check: right before its call the task makes sure the run's lease still holds
   (renewing it with one fenced write if it may have run out); the webhook caller asks
   again after signing and right before the request is written, once the run's name is
   out of the roll (app.worker.orphans), so a process stopped in between sends nothing
   stale (docs/design.md, "Invariants").
Transient registry and Redis failures are retried in place (app.registry.transient);
beyond the budget the message goes back to the broker. Back-pressure: a semaphore of
PUNCTUAL_DISPATCH_THREADS call slots is taken for a message's runs before they start,
at least START_AT_LEAST at a time (`take_call_slots`), so a busy process stops taking
messages (prefetch 1) instead of starting runs it cannot call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app import metrics, tracing
from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.lifecycle.message import DispatchRun
from app.limits import limit_specs
from app.limits.keys import LimitKeyDirectory, named_key
from app.limits.limiter import Limiter
from app.limits.line import ANYONE, Turn
from app.limits.policy import LimitSpec
from app.logs import lazy_log_context
from app.registry.engines import Registry
from app.registry.transient import first_line, retrying
from app.services.owners import OwnerDirectory
from app.settings import Settings
from app.worker import inbox
from app.worker.buffer import CompletionBuffer
from app.worker.inflight import InFlight
from app.worker.orphans import Roll, process_word
from app.worker.queue_publisher import QueueCall, QueuePublisher
from app.worker.slot_wait import Slot, SlotGate, cap_keys, wait_budget_s
from app.worker.turns import LANES, Turns
from app.worker.webhook import NotSent, WebhookCall, WebhookCaller

log = logging.getLogger("punctual.dispatch")

# The fewest runs of a message started together as call slots free (each start is one
# statement, whatever its size): START_AT_LEAST of its runs, or all it has left.
START_AT_LEAST = 50
# Runs started ahead of their instants a process holds on its loop's timers, at most,
# per call slot (PUNCTUAL_DISPATCH_THREADS); past that its dispatch waits, as for call
# slots. A burst claimed ahead is started this far ahead of its calls, not further.
HELD_PER_SLOT = 4
# The lanes of app.worker.turns a run due while every call slot is taken waits in.
RECURRING_LANE, ONE_OFF_LANE = LANES
# How often runs whose instant came while every call slot was taken look for one freed
# since (a call ended, on the loop or a thread).
DUE_LOOK_S = 0.005
# A held run's name is taken out of the roll (app.worker.orphans) at most CLAIM_AHEAD_S
# before its instant, with those of the other held runs firing by then, in one script
# call made CLAIM_LEAD_S before the first of them: the round trip leaves the calls'
# path, and calls spread in time share it. A process that dies in that while has those
# runs' leases taken back, an attempt spent, so names go out ahead only while it has
# call slots free and no run waits for one (those runs are called at their instants);
# a run under a cap that finds it full at its instant has its name put back while it
# waits in the cap's line (Roll.back_in).
CLAIM_AHEAD_S = 0.1
# Ahead of the first instant: more than a round trip to Redis under load.
CLAIM_LEAD_S = 0.02
# The target whose calls take their runs' names out of the roll themselves, at the
# request's last look (WebhookCall.claim); any other target's go out right before its
# call, the side that never lets a taker call a run whose call may be out.
_CLAIMS_AT_LAST_LOOK = "webhook"
# How often the start lateness of the calls made is written to its histogram: once for
# the calls of that while, not once a call (metrics.observe_many).
LATENESS_EVERY_S = 0.5


@dataclass(frozen=True)
class DispatchReport:
    started: int = 0
    held: int = 0
    stale: int = 0


@dataclass
class _Call:
    run: DispatchRun
    caps: tuple  # its concurrency caps, taken right before the call (app.worker.slot_wait)
    keys: frozenset[str]  # the caps' keys: which runs of the process may pass a slot on
    # The concurrency slot it holds (None: no cap, or not yet), given back or handed
    # on when the call ends; shared with the runs it was handed from and to.
    slot: Slot | None = None
    # Until when (time.monotonic) the registry is known to hold this run's lease for
    # us: set from the start, moved on by each heartbeat that extended it.
    lease_until: float = 0.0
    lost: bool = False  # a heartbeat found the token gone: the janitor took the run back
    turn: Turn = ANYONE  # its owner's turn in a full cap's line (app.limits.line)
    trace: Any = None  # its dispatch span's context, the call span's parent (app.tracing)
    # Started ahead of its instant: it holds a place among the process's held runs, not
    # a call slot, until its instant (Dispatcher._at_instant).
    held: bool = False
    # Its run's name was asked out of the roll (app.worker.orphans): a webhook call asks
    # at its request's last look, so one that never got that far still holds its name.
    claimed: bool = False
    # The instant its start wrote (started_at): its roll entry carries it, so that a
    # taker holds back only a run this process started (app.lifecycle.lease.hold).
    started_at: datetime | None = None


def _recorded_as_failure(item: Finished, failure: Exception) -> Finished:
    """What is written instead of a finished attempt whose outcome cannot be written:
    a failed call saying why (a retry follows as after any failure)."""
    reason = f"the outcome could not be recorded ({type(failure).__name__}: {first_line(failure)})"
    return dataclasses.replace(item, outcome=CallOutcome(error=reason))


def _reserver(run: DispatchRun) -> str:
    """Who owns a run's rate reservation across a hold: a schedule run is made anew
    by the next claim, so its job; an off-schedule run keeps its row."""
    return str(run.run_id if run.leased_on_run else run.job_id)


class HolderNames:
    """Names for the slots one admission takes: the run's id, so an operator can tell
    whose they are, then a word unique to this admission. A slot passed on to other
    runs keeps its name while the run it was admitted for may be admitted again (a
    retry, a duplicated message); under one name the two would be one slot.

    The word is the process's (app.worker.orphans.process_word: a taker of a dead
    process's roll gives back the slots whose names carry it), then a count: drawn for
    each admission (os.urandom), it let go of the GIL for each run on the calls' loop,
    and the loop waited for it behind the process's other threads.
    """

    def __init__(self) -> None:
        self._pid = 0
        self._word = ""
        self._count = itertools.count()

    def __call__(self, run: DispatchRun) -> str:
        if self._pid != os.getpid():  # drawn anew in a forked child
            self._pid, self._word, self._count = os.getpid(), process_word(), itertools.count()
        return f"{run.run_id}.{self._word}-{next(self._count):x}"


def _rates(specs: list) -> tuple[LimitSpec, ...]:
    """A run's specs as far as rates go: admitted before its start. (A spec with no
    other limit is used as it is: a copy of each run's spec cost more than the rest.)"""
    return tuple(
        dataclasses.replace(s, max_concurrency=None) if s.max_concurrency else s
        for s in specs
        if s.rate_per_s
    )


def _caps(specs: list) -> tuple[LimitSpec, ...]:
    """A run's specs as far as concurrency caps go: taken right before its call."""
    return tuple(
        dataclasses.replace(s, rate_per_s=None) if s.rate_per_s else s for s in specs if s.max_concurrency
    )


def take_call_slots(slots: threading.Semaphore, wanted: int, floor: int) -> int:
    """Take call slots for the next runs of a message: wait for `floor` of them (or
    `wanted`, if fewer), then take whatever else is free, up to `wanted`; returns how
    many. Waiting for a whole message's worth, a process let its calls in flight drain
    far below its slots before its next runs began, and a cap's slots stood idle
    (docs/design.md, "Decisions")."""
    floor = min(wanted, floor)
    for _ in range(floor):
        slots.acquire()
    taken = floor
    while taken < wanted and slots.acquire(blocking=False):
        taken += 1
    return taken


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        owners: OwnerDirectory,
        limiter: Limiter,
        limit_keys: LimitKeyDirectory,
        webhooks: WebhookCaller,
        queues: Callable[[], QueuePublisher],
        roll: Roll | None = None,
    ):
        """`queues` makes the AMQP publisher on first use: most workers never publish.
        `roll`: where started runs are named until their calls (app.worker.orphans)."""
        self.settings = settings
        self.registry = registry
        self.owners = owners
        self.limiter = limiter
        self.limit_keys = limit_keys
        self.webhooks = webhooks
        self._queues = queues
        self.capacity = settings.dispatch_threads
        self._slots = threading.BoundedSemaphore(self.capacity)
        # Runs started ahead of their instants wait on the loop's timers without a call
        # slot, at most HELD_PER_SLOT x capacity of them; at its instant a run takes a call
        # slot on the loop, or waits there for one (_due: owners in turns, each owner's
        # oldest first, as dispatch messages are served: app.worker.turns). A slot is
        # freed mostly by a call under the same full cap, so first come first served
        # left an owner whose runs came due in the middle of another owner's burst
        # waiting for that burst to pass the cap, before its runs could even stand in
        # the cap's line, where owners take turns.
        self._holds = threading.BoundedSemaphore(HELD_PER_SLOT * self.capacity)
        self._due: Turns[_Call] = Turns()
        # Held runs whose names are still in the roll, by instant (_claim_ahead), and the
        # loop's timer for the next of them.
        self._unclaimed: list[tuple[float, int, _Call]] = []
        self._unclaimed_count = itertools.count()
        self._claim_timer: asyncio.TimerHandle | None = None
        self._claim_at = 0.0
        self._loop = webhooks.loop  # the calls' loop: the webhook session lives on it
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references
        self._lateness: list[float] = []  # of the calls made, observed every LATENESS_EVERY_S
        # While a call's slot is handed on (_slot_free): the run it went to, which the
        # ending call's task carries on with.
        self._handing_on = False
        self._carried: _Call | None = None
        self._turns: dict[tuple[str, int, bool], Turn] = {}  # one per owner, weight and lane
        holder_name = HolderNames()
        self._inflight: InFlight[_Call] = InFlight(self._heartbeat, settings.heartbeat_s)
        self._roll = roll
        if roll is not None:
            roll.holding = lambda: len(self._inflight) > 0
        self._buffer: CompletionBuffer[Finished] = CompletionBuffer(
            self._flush,
            salvage=_recorded_as_failure,
            give_up=lambda item: self._inflight.pop_many([item.run.run_id]),
            name=lambda item: f"the outcome of run {item.run.run_id}",
        )
        self._gate = SlotGate(
            limiter,
            settings.lease_s,
            settings.heartbeat_s,
            wait_budget_s(settings.lease_s),
            self._begin,
            self._put_off,
            lambda call: holder_name(call.run),
            self._in_line,
        )

    def dispatch(self, batch: Sequence[DispatchRun]) -> DispatchReport:
        """Start a message's runs: those due now as call slots free, those whose
        instants are still ahead as places among the held runs free (a call slot is
        theirs only at the instant, so runs waiting for their instants never keep a due
        run from its call)."""
        # A process's first write reads the shard map first: met with the registry away,
        # that read is retried in place as the start's write is, not given up at once
        # (after the budget the message goes back to the broker, see app.tasks.dispatch).
        retrying(self.registry.routing, "reading the shard map")
        now = utcnow()
        ahead = [run for run in batch if run.fire_at is not None and run.fire_at > now]
        due = [run for run in batch if run.fire_at is None or run.fire_at <= now] if ahead else list(batch)
        reports = [
            self._dispatch_with(due, self._slots, False),
            self._dispatch_with(ahead, self._holds, True),
        ]
        return DispatchReport(*(sum(column) for column in zip(*reports, strict=True)))

    def _dispatch_with(
        self, pending: list[DispatchRun], places: threading.Semaphore, held: bool
    ) -> tuple[int, int, int]:
        started = put_off = stale = 0
        limit = self.capacity * (HELD_PER_SLOT if held else 1)
        while pending:
            taken = take_call_slots(places, min(len(pending), limit), START_AT_LEAST)
            part, pending = pending[:taken], pending[taken:]
            unsettled = len(part)  # places still taken by runs not handed to the loop
            try:
                report = self._dispatch_part(part, ahead=held)
                unsettled -= report.started  # their calls give their places back
            finally:
                for _ in range(unsettled):
                    places.release()
            started, put_off, stale = started + report.started, put_off + report.held, stale + report.stale
        return started, put_off, stale

    def _dispatch_part(self, part: list[DispatchRun], ahead: bool = False) -> DispatchReport:
        """Admit the runs' rates, start what they admit, hold back the rest; the calls
        take their concurrency slots on the loop (app.worker.slot_wait)."""
        settings = self.settings
        try:
            self.owners.prefetch_secrets({run.owner for run in part})
        except Exception:  # each call asks for its own owner's secrets then
            log.warning("reading the signing secrets of a message's owners failed", exc_info=True)
        named_pairs = {(run.owner, key) for run in part if (key := named_key(run.target))}
        named = self.limit_keys.lookup_many(named_pairs) if named_pairs else None
        now = utcnow()
        spans = tracing.spans()
        began_ns = time.time_ns() if spans is not None else 0
        entries = [(run, limit_specs(run.owner, run.target, settings, named)) for run in part]
        rated = [(run, rates) for run, specs in entries if (rates := _rates(specs))]
        # Only runs under a rate ask the limiter (one round trip for all of them).
        admissions = (
            retrying(
                lambda: self.limiter.acquire_many(
                    [(rates, str(run.run_id), _reserver(run)) for run, rates in rated], now, settings.lease_s
                ),
                f"admission of {len(rated)} runs",
            )
            if rated
            else []
        )
        refused = {
            run.run_id: admission.retry_instant()
            for (run, _), admission in zip(rated, admissions, strict=True)
            if not admission.admitted
        }
        admitted, held = [], []
        weights = self._weights() if any(len(specs) for _, specs in entries) else {}
        for run, specs in entries:
            if run.run_id in refused:  # a rate: its start is reserved at retry_at
                held.append((run, refused[run.run_id]))
            else:
                caps = _caps(specs)
                admitted.append(_Call(run, caps, cap_keys(caps), turn=self._turn(run, weights), held=ahead))
        calls, stale = self._start(admitted, now, (spans, began_ns) if spans is not None else None)
        if held:  # the started runs are called regardless
            self._hold(held, now)
        if spans is not None:
            for run, _ in held:
                spans.dispatched(run, began_ns, time.time_ns(), "held")
        return DispatchReport(len(calls), len(held), stale)

    def _weights(self) -> dict[str, int]:
        """The owners' weights (cached by the directory), for their turns in a cap's line."""
        try:
            return self.owners.weights()
        except Exception:  # the home DSN away: equal turns meanwhile
            log.warning("owner weights unavailable; owners take equal turns for slots", exc_info=True)
            return {}

    def _turn(self, run: DispatchRun, weights: dict[str, int]) -> Turn:
        """The run's turn in a full cap's line: its owner, the owner's weight, its lane."""
        key = (run.owner, weights.get(run.owner, 1), run.recurring)
        turn = self._turns.get(key)
        if turn is None:
            if len(self._turns) > 10_000:  # owners long gone
                self._turns.clear()
            turn = self._turns[key] = Turn(*key)
        return turn

    def _hold(self, held: list[tuple[DispatchRun, datetime]], now: datetime) -> None:
        """Hold runs back to the registry until their turns (no attempt spent). Should
        the hold fail, their leases run out and the janitor brings them back."""
        try:
            metrics.RUNS.labels("held").inc(lease.hold(self.registry, held, now))
        except Exception:
            log.exception("holding %d runs failed; their leases will bring them back", len(held))
        metrics.count_by_owner("held", (run.owner for run, _ in held))

    def _put_off(self, waited: list[tuple[_Call, datetime]]) -> None:
        """(On a thread.) Hold runs that waited their while for a slot back to the
        registry, each to when its turn is expected. They give back their call slots and
        leave the heartbeat first, so that a failed hold leaves their leases to run out."""
        for _ in waited:
            self._slots.release()
        self._inflight.pop_many([call.run.run_id for call, _ in waited])
        if self._roll is not None:
            self._roll.forget([call.run.run_id for call, _ in waited])
        self._hold([(call.run, at) for call, at in waited], utcnow())

    def _start(self, admitted: list[_Call], now, traced: tuple | None = None) -> tuple[list[_Call], int]:
        """One fenced start for admitted runs, then their calls: (calls started, stale
        runs: a duplicated message, or a lease lost before the start). `traced`: (Spans,
        when the dispatch began) while exporting spans (app.tracing)."""
        if not admitted:
            return [], 0
        settings = self.settings
        roll = self._roll
        if roll is not None:  # named before the start: no instant where a run is started and unnamed
            # (Not a run this process started already, from an earlier delivery of the
            # message: it keeps the name it has, or had until its call.)
            roll.name(
                [c.run for c in admitted if c.run.run_id not in self._inflight],
                {key for call in admitted for key in call.keys},
                now,
            )
        sent = time.monotonic()
        try:
            started_ids = lease.start(self.registry, [c.run for c in admitted], now)
        except BaseException:
            if roll is not None:  # the message goes back, to be started with the same tokens elsewhere
                roll.unname([c.run.run_id for c in admitted if c.run.run_id not in self._inflight])
            raise
        calls = [call for call in admitted if call.run.run_id in started_ids]
        if roll is not None and len(calls) < len(admitted):
            # Another process's runs (same tokens), or this one's, started by an earlier
            # delivery of the message: those keep their names until their calls.
            roll.unname(
                [
                    c.run.run_id
                    for c in admitted
                    if c.run.run_id not in started_ids and c.run.run_id not in self._inflight
                ]
            )
        for call in calls:
            call.lease_until = sent + settings.lease_s
            call.started_at = now
        for shard, count in Counter(call.run.shard for call in calls).items():
            metrics.RUNS_STARTED.labels(str(shard)).inc(count)
        for call in calls:
            self._inflight.add(call.run.run_id, call)
        if traced is not None:  # before the loop has them: a call span's parent is its dispatch
            spans, began_ns = traced
            ended_ns = time.time_ns()
            for call in admitted:
                outcome = "started" if call.run.run_id in started_ids else "stale"
                call.trace = spans.dispatched(call.run, began_ns, ended_ns, outcome)
        if calls:
            self._loop.call_soon(self._start_calls, calls)
        unstarted = len(admitted) - len(calls)
        metrics.STALE_COMPLETIONS.inc(unstarted)
        metrics.count_by_owner("started", (call.run.owner for call in calls))
        return calls, unstarted

    def _release_quietly(self, slots: list) -> None:
        try:
            self.limiter.release_many(slots)
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(slots))

    def _start_calls(self, calls: list[_Call]) -> None:
        """On the loop: one task a call, made once the call has its concurrency slot (a
        run that waits for one is started by the gate: _begin). A run started ahead of
        its instant waits for it on a timer of the loop first (_at_instant)."""
        for call in calls:
            if call.held:
                if self._roll is not None:
                    self._name_out_ahead(call)
                self._at_instant(call)
            else:
                self._take_slot(call)

    def _name_out_ahead(self, call: _Call) -> None:
        """On the loop: the held run's name goes out of the roll a little before its
        instant (CLAIM_AHEAD_S), with those of the held runs firing near it."""
        assert call.run.fire_at is not None
        at = call.run.fire_at.timestamp()
        heapq.heappush(self._unclaimed, (at, next(self._unclaimed_count), call))
        at -= CLAIM_LEAD_S
        if self._claim_timer is None or at < self._claim_at:
            if self._claim_timer is not None:
                self._claim_timer.cancel()
            self._claim_at = at
            self._claim_timer = asyncio.get_running_loop().call_later(at - time.time(), self._claim_ahead)

    def _claim_ahead(self) -> None:
        """On the loop: take out together the names of the held runs firing within
        CLAIM_AHEAD_S, as many as there are call slots free, if no run waits for one
        (the others are claimed at their calls, as due runs are)."""
        self._claim_timer = None
        unclaimed = self._unclaimed
        by = time.time() + CLAIM_AHEAD_S
        firing = []
        while unclaimed and unclaimed[0][0] <= by:
            firing.append(heapq.heappop(unclaimed)[2])
        # (A semaphore's count, read alone: a free call slot taken meanwhile by a thread
        # leaves one run waiting for a slot with its name out, as a call in flight.)
        free = 0 if self._due or self._gate.waiting else self._slots._value
        if firing and free > 0:
            assert self._roll is not None
            self._roll.claim_ahead(call.run.run_id for call in firing[:free])
        if unclaimed:
            self._claim_at = unclaimed[0][0] - CLAIM_LEAD_S
            self._claim_timer = asyncio.get_running_loop().call_later(
                self._claim_at - time.time(), self._claim_ahead
            )

    def _at_instant(self, call: _Call) -> None:
        """On the loop: a held run's call goes ahead once its instant has come (the
        loop's clock is not the wall clock: a timer that fired a little early waits again
        for the rest), with a call slot in place of its place among the held runs."""
        assert call.run.fire_at is not None
        early = (call.run.fire_at - utcnow()).total_seconds()
        if early > 0:
            asyncio.get_running_loop().call_later(early, self._at_instant, call)
            return
        call.held = False
        self._holds.release()
        if self._due or not self._slots.acquire(blocking=False):
            self._due.push(call, RECURRING_LANE if call.turn.recurring else ONE_OFF_LANE, call.turn.owner, 1)
            if len(self._due) == 1:
                asyncio.get_running_loop().call_later(DUE_LOOK_S, self._serve_due)
            return
        self._take_slot(call)

    def _serve_due(self) -> None:
        """On the loop: due runs that found every call slot taken get the slots freed
        since (by a call of this process, or by a thread), owners in turns."""
        due = self._due
        while due and self._slots.acquire(blocking=False):
            call = due.pop()
            assert call is not None
            self._take_slot(call)
        if due:
            asyncio.get_running_loop().call_later(DUE_LOOK_S, self._serve_due)

    def _take_slot(self, call: _Call) -> None:
        if call.caps:
            call.slot = self._gate.take(call, call.caps, call.keys, call.turn)
            if call.slot is None:
                return
        self._spawn(call)

    def _in_line(self, call: _Call) -> None:
        """On the loop: the run found its caps full and waits in their line, for seconds
        perhaps: a name that went out ahead goes back into the roll meanwhile, so that a
        crash has a taker hold the run back, no attempt spent."""
        if self._roll is not None:
            assert call.started_at is not None  # (only a started run waits for a slot)
            self._roll.back_in(call.run, call.started_at)

    def _begin(self, call: _Call, slot: Slot) -> None:
        """On the loop: the gate gave a waiting run its slot. Handed the slot of a call
        that is ending, it is carried on by that call's task (_calls)."""
        call.slot = slot
        if self._handing_on and self._carried is None:
            self._carried = call
        else:
            self._spawn(call)

    def _spawn(self, call: _Call) -> None:
        task = asyncio.ensure_future(self._calls(call))
        self._tasks.add(task)
        task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _call settles every outcome; this only makes a bug visible
            log.error("a call task failed", exc_info=exc)

    async def _calls(self, first: _Call) -> None:
        """A call's task: the call, then the run handed its slot as it ended, and so on.
        A new task for the next run would hold the slot, idle, for a turn of the loop
        before the call is made, and under a burst that turn is long next to a short
        call."""
        call: _Call | None = first
        while call is not None:
            call = await self._call(call)

    async def _call(self, call: _Call) -> _Call | None:
        """Make the call and settle it; the run handed its slot as it ended, if any."""
        run = call.run
        if not self._lease_known(call) and not await asyncio.to_thread(self._still_leased, call):
            self._slots.release()
            await asyncio.to_thread(self._withdraw, call)
            return None
        # A webhook call's name goes out at its request's last look, on the connection
        # made (app.worker.webhook); the other targets' names go out here.
        if self._roll is not None and run.target.get("type", "webhook") != _CLAIMS_AT_LAST_LOOK:
            call.claimed = True
            if not await self._roll.claim(run.run_id):
                # A taker thought this process dead and made the run due again.
                self._slots.release()
                await asyncio.to_thread(self._withdraw, call)
                return None
        called_at = utcnow()
        self._lateness.append(max(0.0, (called_at - run.scheduled_for).total_seconds()))
        if len(self._lateness) == 1:
            asyncio.get_running_loop().call_later(LATENESS_EVERY_S, self._observe_lateness)
        # Every line logged while this run is called (here, in the webhook caller, the
        # limiter, the libraries) names it (app.logs; the task has its own context).
        with lazy_log_context(
            lambda: {
                "job_id": str(run.job_id),
                "run_id": str(run.run_id),
                "shard": run.shard,
                "attempt": run.attempt,
                "owner": run.owner,
            }
        ):
            outcome: CallOutcome | None = None
            try:
                outcome = await self._attempt(call)
            except NotSent:  # the process stalled between the check and the request (slot: finally)
                await asyncio.to_thread(self._withdraw, call)
            except Exception as exc:  # a bug here must still settle the run, as a retryable failure
                log.exception("call of run %s failed", run.run_id)
                outcome = CallOutcome(error=f"internal error: {type(exc).__name__}: {exc}")
            finally:
                carried = self._slot_free(call)
                self._slots.release()
            if not call.claimed and self._roll is not None:
                # Its request never got to the write (a connection failed, a secret was
                # missing, the call withdrawn): no call went out, its name goes too.
                self._roll.forget([run.run_id])
            if outcome is not None:
                # (No await from here on: the carried run is this task's to call.)
                log.debug("run %s called: %s, %s", run.run_id, outcome.status_code, outcome.error)
                self._buffer.add(Finished(run, outcome, utcnow(), called_at))
        return carried

    def _observe_lateness(self) -> None:
        """(On the loop.) The start lateness of the calls made since the last time."""
        lateness, self._lateness = self._lateness, []
        metrics.observe_many(metrics.START_LATENESS, lateness)

    def _slot_free(self, call: _Call) -> _Call | None:
        """The call is over: its slot goes to a run waiting for one in this process (the
        run is returned, for this task to call), or back to the limiter, now, not once
        the outcome is recorded."""
        slot = call.slot
        if slot is None:
            return None
        # A lost call's slot is never handed on: another attempt of its run may be under
        # way. (Withdrawn before its call, it went back already; once more is harmless.)
        if call.lost:
            self._gate.release(call.caps, slot.holder)
            return None
        self._handing_on = True
        try:
            if not self._gate.give(call.caps, call.keys, slot):
                self._gate.release(call.caps, slot.holder)
        finally:
            self._handing_on = False
        carried, self._carried = self._carried, None
        return carried

    def _withdraw(self, call: _Call) -> None:
        """The janitor took the run back (this process was stopped, or starved, past its
        lease) and another attempt may be under way: call nothing, record nothing. (The
        caller gives back the thread slot.)"""
        call.lost = True
        self._inflight.pop_many([call.run.run_id])
        if self._roll is not None:
            self._roll.forget([call.run.run_id])
        if call.slot is not None:
            self._release_quietly([(call.caps, call.slot.holder)])
        metrics.STALE_COMPLETIONS.inc()
        log.warning("run %s lost its lease before its call; not called", call.run.run_id)

    def _lease_known(self, call: _Call) -> bool:
        """Whether `call`'s lease is known to hold for a while yet (no round trip)."""
        return not call.lost and time.monotonic() + self.settings.heartbeat_s < call.lease_until

    def _still_leased(self, call: _Call) -> bool:
        """Whether this worker may still call `call`: its lease is known to hold for a
        while yet, or a fenced renewal (one round trip, only for a run that waited
        long) says it does. (It may block: the loop runs it on a thread.)"""
        if call.lost:
            return False
        if self._lease_known(call):
            return True
        sent = time.monotonic()
        try:
            kept = lease.heartbeat(self.registry, [call.run], utcnow())
        except Exception:  # cannot tell: not calling is the side that keeps invariant 1
            log.exception("renewing the lease of run %s before its call failed", call.run.run_id)
            return False
        if call.run.run_id not in kept:
            return False
        call.lease_until = sent + self.settings.lease_s
        return True

    async def _attempt(self, call: _Call) -> CallOutcome:
        spans = tracing.spans() if call.trace is not None else None
        if spans is None:
            return await self._attempt_traced(call, tracing.traceparent(call.run.run_id))
        span, traceparent = spans.call(call.run, call.trace)
        outcome = None
        try:
            outcome = await self._attempt_traced(call, traceparent)
            return outcome
        finally:
            spans.called(span, outcome)

    async def _attempt_traced(self, call: _Call, traceparent: str) -> CallOutcome:
        """The call itself, carrying `traceparent` (app.tracing)."""
        run = call.run
        if run.target.get("type") == "postgres":  # an inbox row in the target's database (app.worker.inbox)
            return await asyncio.to_thread(inbox.attempt, self.settings, run)
        signing_secrets = self.owners.cached_signing_secrets(run.owner)
        if signing_secrets is None:  # read on a thread: the registry is not the loop's to wait for
            signing_secrets = await asyncio.to_thread(self.owners.signing_secrets, run.owner)
        if not signing_secrets:
            return CallOutcome(error=f"owner {run.owner!r} has no signing secret", retryable_error=False)
        if run.target.get("type") == "queue":
            return await asyncio.to_thread(
                self._queues().publish,
                QueueCall(
                    run.texts[1],
                    run.scheduled_for,
                    run.attempt,
                    run.target["topic"],
                    run.payload,
                    signing_secrets,
                    traceparent,
                ),
            )
        return await self.webhooks.send(
            WebhookCall(
                run.texts[1],
                run.scheduled_for,
                run.attempt,
                run.target,
                run.payload,
                signing_secrets,
                # No round trip here: only whether the lease known at the check
                # still runs, as the request is about to go out.
                may_send=lambda: not call.lost and time.monotonic() < call.lease_until,
                traceparent=traceparent,
                claim=None if self._roll is None else functools.partial(self._claim, call),
            )
        )

    def _claim(self, call: _Call) -> Awaitable[bool]:
        """(On the loop.) Take the call's name out of the roll, at its request's last
        look: whether it may still be called (app.worker.orphans.Roll.claim)."""
        assert self._roll is not None
        call.claimed = True
        return self._roll.claim(call.run.run_id)

    def _flush(self, items: list[Finished]) -> None:
        complete(self.registry, items, utcnow())
        # (Their concurrency slots went back when their calls ended.)
        self._inflight.pop_many([item.run.run_id for item in items])

    def _heartbeat(self, calls: list[_Call]) -> None:
        """Renew the leases of the runs in flight that have held theirs for a beat or
        more (the others have at least lease_s - heartbeat_s left, and the next beat
        comes first: a run whose call ends within a beat of its start never has its
        row written for its lease), and the slots of all."""
        sent = time.monotonic()
        renew_below = self.settings.lease_s - self.settings.heartbeat_s
        due = [call for call in calls if call.lease_until - sent < renew_below]
        kept = lease.heartbeat(self.registry, [call.run for call in due], utcnow()) if due else set()
        for call in due:
            if call.run.run_id in kept:
                call.lease_until = sent + self.settings.lease_s
            else:  # taken back (or already completed): a call not yet made must not start
                call.lost = True
        renewing = time.monotonic()
        self.limiter.renew_many(
            [(call.caps, call.slot.holder) for call in calls if call.slot is not None], self.settings.lease_s
        )
        for call in calls:
            # A slot whose lease had run out is not taken back by a renewal (the limiter's
            # contract): only a live one is known to run on.
            if call.slot is not None and call.slot.until > renewing:
                call.slot.until = max(call.slot.until, renewing + self.settings.lease_s - 1.0)

    def in_flight(self) -> int:
        return len(self._inflight)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait (at most `timeout_s`) for calls in flight, runs put off and completions."""
        deadline = time.monotonic() + timeout_s
        self._inflight.wait_empty(timeout_s)
        self._loop.call_soon(self._observe_lateness)
        try:  # runs put off after their wait for a slot left the heartbeat before their hold is written;
            # parked slots go back before the loop stops
            self._loop.submit(self._settled()).result(max(0.1, deadline - time.monotonic()))
        except Exception:  # their leases run out and the janitor brings them back
            log.warning("writing back the runs put off failed", exc_info=True)
        self._buffer.close(max(0.1, deadline - time.monotonic()))
        self._inflight.stop()

    async def _settled(self) -> None:
        await self._gate.settled()
        await self.limiter.aclose()
        if self._roll is not None:
            await self._roll.aclose()
