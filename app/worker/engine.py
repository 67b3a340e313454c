"""The dispatcher: a worker process's engine for starting runs and calling targets.

`dispatch(batch)` (called by the Celery dispatch task) does, for a batch of runs:

1. limits: one `acquire_many` for the batch (rate + concurrency cap per key,
   app.limits). A run held by a rate has its start reserved and is put off until
   then (app.lifecycle.lease.hold: one registry write, no attempt spent). A run that
   finds a cap full waits here for a slot, its message unacknowledged, up to a
   second or two (app.worker.slot_wait): it is admitted as soon as calls of this
   process on that key end, or a poll finds slots freed elsewhere; only a run still
   waiting then is put off, once, to when a slot is expected;
2. start: one fenced UPDATE for the admitted runs; a run it does not return was
   started already (a duplicated message) or lost its lease: nothing is called
   and its slot goes back;
3. call: each started run becomes a task on the process's event loop
   (app.worker.event_loop), and dispatch returns. The calls finish in the
   background; a call's concurrency slots go back the moment it ends (a cap bounds
   calls in flight), its completion is written in batches by the completion buffer,
   and its lease is extended by the heartbeat until then. What blocks (a renewal of
   the lease, an owner's secrets not cached, a publish to a queue target) runs on the
   loop's threads, not on the loop.
4. lease check: right before its call, the task makes sure the run's lease still
   holds. The worker knows until when it does (from the start and from each
   heartbeat that extended it); a run whose lease may have run out (the process was
   stopped or starved) is renewed first with one fenced UPDATE, and a run that a
   heartbeat or that renewal found taken back is not called at all. The webhook
   caller asks once more (in memory, no round trip) after the headers are built and
   signed, and again right before the request is written to the socket, headers and
   body in one write (after the pool and the connect), so a process stopped in
   between sends nothing stale either: a target does not get an older attempt after
   a newer one.

Transient registry and Redis failures of the admission and the start are retried in
place (app.registry.transient); when they last beyond the retry budget the dispatch
task gives its message back to the broker instead of sitting on its runs.

Back-pressure: a semaphore of PUNCTUAL_DISPATCH_THREADS slots (calls in flight) is
taken for each run of a message before its limits are asked, so a busy process stops
taking messages (prefetch 1) instead of queueing calls it cannot make. A run waiting
for a cap slot holds one too: behind a cap of 200 with 200 ms calls a process holding
many of the cap's calls waits for some of them to end before its next message's runs
join the wait (and take slots handed on in this process). With a semaphore too big
to bind (PUNCTUAL_DISPATCH_THREADS=1000) three times as many slots were handed on,
but the starts came in smaller statements, for no more starts a second
(bench/README.md, 2026-12-02 17:10 UTC), so the order stays.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app import metrics
from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.lifecycle.message import DispatchRun, chunks
from app.limits import limit_specs
from app.limits.keys import LimitKeyDirectory, named_key
from app.limits.limiter import CAP, Limiter
from app.logs import log_context
from app.registry.engines import Registry
from app.registry.transient import retrying
from app.services.owners import OwnerDirectory
from app.settings import Settings
from app.worker.buffer import CompletionBuffer
from app.worker.inflight import InFlight
from app.worker.queue_publisher import QueueCall, QueuePublisher
from app.worker.slot_wait import (
    BATCH_WAIT_S,
    POLL_S,
    Handed,
    Slot,
    SlotReleaser,
    SlotWaits,
    batch_size,
    expected_slot_at,
    wait_budget_s,
)
from app.worker.webhook import NotSent, WebhookCall, WebhookCaller

log = logging.getLogger("punctual.dispatch")


@dataclass(frozen=True)
class DispatchReport:
    started: int = 0
    held: int = 0
    stale: int = 0


@dataclass
class _Call:
    run: DispatchRun
    specs: list
    # The concurrency slot it holds (None: no cap), given back or handed on when the
    # call ends; shared with the runs it was handed from and to.
    slot: Slot | None = None
    # Until when (time.monotonic) the registry is known to hold this run's lease for
    # us: set from the start, moved on by each heartbeat that extended it.
    lease_until: float = 0.0
    lost: bool = False  # a heartbeat found the token gone: the janitor took the run back

    @property
    def holder(self) -> str:
        """The name of its slots in the limiter, given at their admission (_holder_name)."""
        return self.slot.holder if self.slot is not None else str(self.run.run_id)


def _reserver(run: DispatchRun) -> str:
    """Who owns a run's rate reservation across a hold: a schedule run is made anew
    by the next claim, so its job; an off-schedule run keeps its row."""
    return str(run.run_id if run.off_schedule else run.job_id)


def _holder_name(run: DispatchRun) -> str:
    """A name for the slots one admission takes: the run's id, so an operator can tell
    whose they are, and a few random bytes, unique to this admission. A slot passed on
    to other runs keeps its name while the run it was admitted for may be admitted
    again (a retry, a duplicated message); under one name the two would be one slot."""
    return f"{run.run_id}.{secrets.token_hex(4)}"


def _cap_of(specs: list):
    """The tightest cap among a run's specs (the one it most likely waits for)."""
    return min((s for s in specs if s.max_concurrency), key=lambda s: s.max_concurrency, default=None)


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
    ):
        """`queues` makes the AMQP publisher on first use: most workers never publish."""
        self.settings = settings
        self.registry = registry
        self.owners = owners
        self.limiter = limiter
        self.limit_keys = limit_keys
        self.webhooks = webhooks
        self._queues = queues
        self.capacity = settings.dispatch_threads
        self._slots = threading.BoundedSemaphore(self.capacity)
        self._loop = webhooks.loop  # the calls' loop: the webhook session lives on it
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references
        self._inflight: InFlight[_Call] = InFlight(self._heartbeat, settings.heartbeat_s)
        self._buffer: CompletionBuffer[Finished] = CompletionBuffer(self._flush)
        self._waits = SlotWaits()
        self._releaser = SlotReleaser(limiter.release_many, self._waits)
        self.wait_s = wait_budget_s(settings.lease_s)

    def dispatch(self, batch: Sequence[DispatchRun]) -> DispatchReport:
        started = held = stale = 0
        for part in chunks(list(batch), self.capacity):
            for _ in part:
                self._slots.acquire()
            unsettled = [len(part)]  # call slots still taken by runs not handed to the loop
            try:
                report = self._dispatch_part(part, unsettled)
            finally:
                for _ in range(unsettled[0]):
                    self._slots.release()
            started, held, stale = started + report.started, held + report.held, stale + report.stale
        return DispatchReport(started, held, stale)

    def _dispatch_part(self, part: list[DispatchRun], unsettled: list[int]) -> DispatchReport:
        """Start what the limits admit; let runs behind a full cap wait for a slot here
        (at most self.wait_s), then put off the ones still waiting."""
        settings = self.settings
        try:
            self.owners.prefetch_secrets({run.owner for run in part})
        except Exception:  # each call asks for its own owner's secrets then
            log.warning("reading the signing secrets of a message's owners failed", exc_info=True)
        named_pairs = {(run.owner, key) for run in part if (key := named_key(run.target))}
        named = self.limit_keys.lookup_many(named_pairs) if named_pairs else None
        waiting = [(run, limit_specs(run.owner, run.target, settings, named)) for run in part]
        waits = self._waits
        released = waits.released
        calls, waiting, held, stale = self._admit_and_start(waiting, utcnow())
        # The wait for a slot starts once the limiter has answered. A limiter slow to
        # answer (Redis paused or reconnecting) is not time spent waiting for slots:
        # counted as such, it used up the wait at once and made the pace of slots look
        # near zero, so the runs put off were given turns tens of seconds late.
        began = last_try = time.monotonic()
        unsettled[0] -= len(calls)  # their calls give their call slots back
        started = len(calls)
        got_slot: Counter = Counter()  # cap key -> runs that got a slot after waiting
        if not waiting:
            return DispatchReport(started, held, stale)
        line = waits.open(waiting)  # calls ending in this process may hand their slots to these
        try:
            while True:
                entries = waits.entries(line)
                caps = {
                    spec.key: spec.max_concurrency
                    for _, specs in entries + [h.entry for h in line.handed]
                    for spec in specs
                    if spec.max_concurrency
                }
                batch = batch_size(len(entries) + len(line.handed), min(caps.values(), default=1))
                if line.handed:
                    # The calls ending meanwhile join this one fenced start: a batch, or
                    # what came in BATCH_WAIT_S (its slots idle meanwhile).
                    calls, stale_now = self._start_handed(waits.take_handed(line, batch, BATCH_WAIT_S))
                    got_slot.update(cap.key for call in calls if (cap := _cap_of(call.specs)))
                    unsettled[0] -= len(calls)
                    started, stale = started + len(calls), stale + stale_now
                    entries = waits.entries(line)
                left = began + self.wait_s - time.monotonic()
                if not entries or left <= 0:
                    break
                # Woken once a call of this process handed its slot to one of these runs,
                # or gave back enough slots for a batch, or after POLL_S for slots freed
                # by other processes (app.worker.slot_wait).
                released = waits.wait(released, min(POLL_S, left), enough=batch, waiting=line)
                if line.handed:
                    continue
                free = retrying(functools.partial(self._free_slots, caps), "free slots")
                ready = waits.take(line, free)
                if not ready:
                    continue
                if len(ready) < batch and time.monotonic() - last_try < BATCH_WAIT_S:
                    waits.put_back(line, ready)
                    continue
                last_try = time.monotonic()
                calls, still, held_now, stale_now = self._admit_and_start(ready, utcnow())
                waits.put_back(line, still)
                got_slot.update(cap.key for call in calls if (cap := _cap_of(call.specs)))
                unsettled[0] -= len(calls)
                started, held, stale = started + len(calls), held + held_now, stale + stale_now
        except BaseException:  # the message goes back: slots handed to its runs go back too
            handed, _ = waits.close(line)
            self._release_quietly([(h.entry[1], h.slot.holder) for h in handed])
            raise
        handed, waiting = waits.close(line)
        if handed:  # handed a slot after the last look: they start like the others
            calls, stale_now = self._start_handed(handed)
            got_slot.update(cap.key for call in calls if (cap := _cap_of(call.specs)))
            unsettled[0] -= len(calls)
            started, stale = started + len(calls), stale + stale_now
        if waiting:
            held += self._put_off(waiting, got_slot, time.monotonic() - began)
        return DispatchReport(started, held, stale)

    def _free_slots(self, caps: dict[str, int]) -> dict[str, int]:
        return self.limiter.free_slots(caps, utcnow())

    def _put_off(self, waiting: list, got_slot: Counter, waited_s: float) -> int:
        """Hold runs that waited their while for a slot back to the registry, each to
        when its turn is expected at the pace slots came meanwhile (no attempt spent)."""
        now = utcnow()
        positions: Counter = Counter()
        put_off = []
        for run, specs in waiting:
            cap = _cap_of(specs)
            key = cap.key if cap else ""
            pace = got_slot[key] / waited_s if waited_s > 0 else 0.0
            put_off.append(
                (
                    run,
                    expected_slot_at(now, positions[key], pace, waited_s, cap.max_concurrency if cap else 1),
                )
            )
            positions[key] += 1
        try:
            metrics.RUNS.labels("held").inc(lease.hold(self.registry, put_off, now))
        except Exception:  # the held ones wait for their lease
            log.exception("holding %d runs failed; their leases will bring them back", len(put_off))
        metrics.count_by_owner("held", (run.owner for run, _ in put_off))
        return len(put_off)

    def _admit_and_start(
        self, entries: list[tuple[DispatchRun, list]], now
    ) -> tuple[list[_Call], list, int, int]:
        """One limiter round trip and one fenced start for `entries`: (calls started,
        (run, specs) still waiting for a slot, runs put off by a rate, stale runs)."""
        settings = self.settings
        acquired = time.monotonic()
        holders = {run.run_id: _holder_name(run) for run, _ in entries}
        admissions = retrying(
            lambda: self.limiter.acquire_many(
                [(specs, holders[run.run_id], _reserver(run)) for run, specs in entries],
                now,
                settings.lease_s,
            ),
            f"admission of {len(entries)} runs",
        )
        admitted, waiting, held = [], [], []
        for (run, specs), admission in zip(entries, admissions, strict=True):
            if admission.admitted:
                capped = any(s.max_concurrency for s in specs)
                # The slot's lease runs from `now` (the limiter's clock): a second less,
                # for the two clocks and the round trip.
                slot = (
                    Slot(holders[run.run_id], acquired, acquired + settings.lease_s - 1.0) if capped else None
                )
                admitted.append(_Call(run, specs, slot))
            elif admission.reason == CAP:
                waiting.append((run, specs))
            else:  # a rate: its start is reserved at retry_at
                held.append((run, admission.retry_instant()))
        calls, stale = self._start(admitted, now)
        if held:
            try:
                metrics.RUNS.labels("held").inc(lease.hold(self.registry, held, now))
            except Exception:  # the started runs are called regardless; the held ones wait for their lease
                log.exception("holding %d runs failed; their leases will bring them back", len(held))
            metrics.count_by_owner("held", (run.owner for run, _ in held))
        return calls, waiting, len(held), stale

    def _start_handed(self, handed: list[Handed]) -> tuple[list[_Call], int]:
        """Start runs that were handed the slot of a call that ended (admitted already)."""
        metrics.SLOTS_HANDED_OVER.inc(len(handed))
        return self._start([_Call(h.entry[0], h.entry[1], h.slot) for h in handed], utcnow())

    def _start(self, admitted: list[_Call], now) -> tuple[list[_Call], int]:
        """One fenced start for admitted runs, then their calls: (calls started, stale
        runs, whose slots go back)."""
        if not admitted:
            return [], 0
        settings = self.settings
        sent = time.monotonic()
        try:
            started_ids = lease.start(self.registry, [c.run for c in admitted], now)
        except Exception:  # the registry stayed away: the message goes back (app.tasks.dispatch)
            self._release_quietly([(call.specs, call.holder) for call in admitted])
            raise
        calls = []
        for call in admitted:
            if call.run.run_id in started_ids:
                call.lease_until = sent + settings.lease_s
                calls.append(call)
                metrics.START_LATENESS.observe(max(0.0, (now - call.run.scheduled_for).total_seconds()))
                metrics.RUNS_STARTED.labels(str(call.run.shard)).inc()
        for call in calls:
            self._inflight.add(call.run.run_id, call)
        if calls:
            self._loop.call_soon(self._start_calls, calls)
        unstarted = [(call.specs, call.holder) for call in admitted if call.run.run_id not in started_ids]
        if unstarted:  # a duplicated message, or a lease lost before the start: nothing is called
            self._releaser.put_many(unstarted)
            metrics.STALE_COMPLETIONS.inc(len(unstarted))
        metrics.count_by_owner("started", (call.run.owner for call in calls))
        return calls, len(unstarted)

    def _release_quietly(self, slots: list) -> None:
        try:
            self.limiter.release_many(slots)
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(slots))

    def _start_calls(self, calls: list[_Call]) -> None:
        """On the loop: one task a call."""
        for call in calls:
            task = asyncio.ensure_future(self._call(call))
            self._tasks.add(task)
            task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _call settles every outcome; this only makes a bug visible
            log.error("a call task failed", exc_info=exc)

    async def _call(self, call: _Call) -> None:
        run = call.run
        if not self._lease_known(call) and not await asyncio.to_thread(self._still_leased, call):
            self._slots.release()
            await asyncio.to_thread(self._withdraw, call)
            return
        # Every line logged while this run is called (here, in the webhook caller, the
        # limiter, the libraries) names it (app.logs; the task has its own context).
        with log_context(
            job_id=str(run.job_id),
            run_id=str(run.run_id),
            shard=run.shard,
            attempt=run.attempt,
            owner=run.owner,
        ):
            try:
                outcome = await self._attempt(call)
            except NotSent:  # the process stalled between the check and the request (slot: finally)
                await asyncio.to_thread(self._withdraw, call)
                return
            except Exception as exc:  # a bug here must still settle the run, as a retryable failure
                log.exception("call of run %s failed", run.run_id)
                outcome = CallOutcome(error=f"internal error: {type(exc).__name__}: {exc}")
            finally:
                self._slot_free(call)
                self._slots.release()
            log.debug("run %s called: status %s, error %s", run.run_id, outcome.status_code, outcome.error)
        self._buffer.add(Finished(run, outcome, utcnow()))

    def _slot_free(self, call: _Call) -> None:
        """The call is over: its slot goes to a run waiting for one in this process, or
        back to the limiter, now, not once the outcome is recorded."""
        slot = call.slot
        # A lost call's slot went back already (_withdraw): its name is not to be handed on.
        if slot is not None and (
            call.lost
            or not self._waits.hand_over(call.specs, slot, time.monotonic(), self.settings.heartbeat_s)
        ):
            self._releaser.put((call.specs, slot.holder))

    def _withdraw(self, call: _Call) -> None:
        """The janitor took the run back (this process was stopped, or starved, past its
        lease) and another attempt may be under way: call nothing, record nothing. (The
        caller gives back the thread slot.)"""
        call.lost = True
        self._inflight.pop_many([call.run.run_id])
        self._release_quietly([(call.specs, call.holder)])
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
        run = call.run
        signing_secrets = self.owners.cached_signing_secrets(run.owner)
        if signing_secrets is None:  # read on a thread: the registry is not the loop's to wait for
            signing_secrets = await asyncio.to_thread(self.owners.signing_secrets, run.owner)
        if not signing_secrets:
            return CallOutcome(error=f"owner {run.owner!r} has no signing secret", retryable_error=False)
        if run.target.get("type") == "queue":
            return await asyncio.to_thread(
                self._queues().publish,
                QueueCall(
                    str(run.job_id),
                    run.scheduled_for,
                    run.attempt,
                    run.target["topic"],
                    run.payload,
                    signing_secrets,
                ),
            )
        return await self.webhooks.send(
            WebhookCall(
                str(run.job_id),
                run.scheduled_for,
                run.attempt,
                run.target,
                run.payload,
                signing_secrets,
                # No round trip here: only whether the lease known at the check
                # still runs, as the request is about to go out.
                may_send=lambda: not call.lost and time.monotonic() < call.lease_until,
            )
        )

    def _flush(self, items: list[Finished]) -> None:
        complete(self.registry, items, utcnow())
        # (Their concurrency slots went back when their calls ended.)
        self._inflight.pop_many([item.run.run_id for item in items])

    def _heartbeat(self, calls: list[_Call]) -> None:
        sent = time.monotonic()
        kept = lease.heartbeat(self.registry, [call.run for call in calls], utcnow())
        for call in calls:
            if call.run.run_id in kept:
                call.lease_until = sent + self.settings.lease_s
            else:  # taken back (or already completed): a call not yet made must not start
                call.lost = True
        renewing = time.monotonic()
        self.limiter.renew_many([(call.specs, call.holder) for call in calls], self.settings.lease_s)
        for call in calls:
            # A slot whose lease had run out is not taken back by a renewal (the limiter's
            # contract): only a live one is known to run on.
            if call.slot is not None and call.slot.until > renewing:
                call.slot.until = max(call.slot.until, renewing + self.settings.lease_s - 1.0)

    def in_flight(self) -> int:
        return len(self._inflight)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait (at most `timeout_s`) for calls in flight and their completions."""
        deadline = time.monotonic() + timeout_s
        self._inflight.wait_empty(timeout_s)
        self._buffer.close(max(0.1, deadline - time.monotonic()))
        self._inflight.stop()
        self._releaser.stop()
