"""The dispatcher: a worker process's engine for starting runs and calling targets.

`dispatch(batch)` (called by the Celery dispatch task) does, for a batch of runs:

1. limits: one `acquire_many` for the batch (token bucket + concurrency cap per
   key, app.limits); a run held back is put off (app.lifecycle.lease.hold) without
   spending an attempt;
2. start: one fenced UPDATE for the admitted runs; a run it does not return was
   started already (a duplicated message) or lost its lease: nothing is called
   and its slot goes back;
3. call: each started run is handed to the process's pool of
   PUNCTUAL_DISPATCH_THREADS threads, and dispatch returns. The calls finish in
   the background; their completions are written in batches by the completion
   buffer, and their leases extended by the heartbeat while they are in flight.
4. lease check: right before its call, a thread makes sure the run's lease still
   holds. The worker knows until when it does (from the start and from each
   heartbeat that extended it); a run whose lease may have run out (the process was
   stopped or starved) is renewed first with one fenced UPDATE, and a run that a
   heartbeat or that renewal found taken back is not called at all. The webhook
   caller asks once more (in memory, no round trip) as the request is about to go
   out, after its headers are built and signed, so a process stopped in between
   sends nothing stale either: a target does not get an older attempt after a
   newer one.

Transient registry and Redis failures of the admission and the start are retried in
place (app.registry.transient); when they last beyond the retry budget the dispatch
task gives its message back to the broker instead of sitting on its runs.

Back-pressure: a semaphore of PUNCTUAL_DISPATCH_THREADS slots is taken before a run
is started, so a busy process stops taking messages (prefetch 1) instead of
queueing calls it cannot make.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from app import metrics
from app.limits import limit_specs
from app.limits.keys import LimitKeyDirectory, named_key
from app.limits.limiter import Limiter
from app.core.retries import CallOutcome
from app.lifecycle import lease
from app.worker.buffer import CompletionBuffer
from app.lifecycle.completion import Finished, complete
from app.worker.inflight import InFlight
from app.lifecycle.message import DispatchRun, chunks
from app.registry.engines import Registry
from app.registry.transient import retrying
from app.services.owners import OwnerDirectory
from app.settings import Settings
from app.worker.queue_publisher import QueueCall, QueuePublisher
from app.worker.webhook import NotSent, WebhookCall, WebhookCaller
from app.core.timefmt import utcnow
from app.logs import log_context

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
    # Until when (time.monotonic) the registry is known to hold this run's lease for
    # us: set from the start, moved on by each heartbeat that extended it.
    lease_until: float = 0.0
    lost: bool = False  # a heartbeat found the token gone: the janitor took the run back


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
        self._calls = _CallThreads(self.capacity, self._call)
        self._inflight: InFlight[_Call] = InFlight(self._heartbeat, settings.heartbeat_s)
        self._buffer: CompletionBuffer[Finished] = CompletionBuffer(self._flush)

    def dispatch(self, batch: Sequence[DispatchRun]) -> DispatchReport:
        started = held = stale = 0
        for part in chunks(list(batch), self.capacity):
            for _ in part:
                self._slots.acquire()
            try:
                calls, held_now, stale_now = self._admit_and_start(part)
            except BaseException:
                for _ in part:
                    self._slots.release()
                raise
            for _ in range(len(part) - len(calls)):
                self._slots.release()
            for call in calls:
                self._inflight.add(call.run.run_id, call)
                self._calls.put(call)
            started, held, stale = started + len(calls), held + held_now, stale + stale_now
        return DispatchReport(started, held, stale)

    def _admit_and_start(self, part: list[DispatchRun]) -> tuple[list[_Call], int, int]:
        settings = self.settings
        now = utcnow()
        named_pairs = {(run.owner, key) for run in part if (key := named_key(run.target))}
        named = self.limit_keys.lookup_many(named_pairs) if named_pairs else None
        specs = [limit_specs(run.owner, run.target, settings, named) for run in part]
        admissions = retrying(lambda: self.limiter.acquire_many(
            [(spec, str(run.run_id)) for run, spec in zip(part, specs)], now, settings.lease_s
        ), f"admission of {len(part)} runs")
        admitted = [_Call(run, spec) for run, spec, admission in zip(part, specs, admissions) if admission.admitted]
        held = [(run, admission.retry_instant()) for run, admission in zip(part, admissions) if not admission.admitted]
        sent = time.monotonic()
        try:
            started_ids = lease.start(self.registry, [c.run for c in admitted], now) if admitted else set()
        except Exception:  # the registry stayed away: the message goes back (app.tasks.dispatch)
            self._release_quietly([(call.specs, str(call.run.run_id)) for call in admitted])
            raise
        calls, stale = [], 0
        for call in admitted:
            if call.run.run_id in started_ids:
                call.lease_until = sent + settings.lease_s
                calls.append(call)
                metrics.START_LATENESS.observe(max(0.0, (now - call.run.scheduled_for).total_seconds()))
                metrics.RUNS_STARTED.labels(str(call.run.shard)).inc()
        unstarted = [(call.specs, str(call.run.run_id)) for call in admitted if call.run.run_id not in started_ids]
        if unstarted:  # a duplicated message, or a lease lost before the start: nothing is called
            stale = len(unstarted)
            self._release_quietly(unstarted)
        if stale:
            metrics.STALE_COMPLETIONS.inc(stale)
        if held:
            try:
                metrics.RUNS.labels("held").inc(lease.hold(self.registry, held, now))
            except Exception:  # the started runs are called regardless; the held ones wait for their lease
                log.exception("holding %d runs failed; their leases will bring them back", len(held))
            metrics.count_by_owner("held", (run.owner for run, _ in held))
        metrics.count_by_owner("started", (call.run.owner for call in calls))
        return calls, len(held), stale

    def _release_quietly(self, slots: list) -> None:
        try:
            self.limiter.release_many(slots)
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(slots))

    def _call(self, call: _Call) -> None:
        run = call.run
        if not self._still_leased(call):
            self._slots.release()
            self._withdraw(call)
            return
        # Every line logged while this run is called (here, in the webhook caller, the
        # limiter, the libraries) names it (app.logs).
        with log_context(job_id=str(run.job_id), run_id=str(run.run_id), shard=run.shard, attempt=run.attempt,
                         owner=run.owner):
            try:
                outcome = self._attempt(call)
            except NotSent:  # the process stalled between the check and the request (slot: finally)
                self._withdraw(call)
                return
            except Exception as exc:  # a bug here must still settle the run, as a retryable failure
                log.exception("call of run %s failed", run.run_id)
                outcome = CallOutcome(error=f"internal error: {type(exc).__name__}: {exc}")
            finally:
                self._slots.release()
            log.debug("run %s called: status %s, error %s", run.run_id, outcome.status_code, outcome.error)
        self._buffer.add(Finished(run, outcome, utcnow()))

    def _withdraw(self, call: _Call) -> None:
        """The janitor took the run back (this process was stopped, or starved, past its
        lease) and another attempt may be under way: call nothing, record nothing. (The
        caller gives back the thread slot.)"""
        self._inflight.pop_many([call.run.run_id])
        self._release_quietly([(call.specs, str(call.run.run_id))])
        metrics.STALE_COMPLETIONS.inc()
        log.warning("run %s lost its lease before its call; not called", call.run.run_id)

    def _still_leased(self, call: _Call) -> bool:
        """Whether this worker may still call `call`: its lease is known to hold for a
        while yet, or a fenced renewal (one round trip, only for a run that waited
        long) says it does."""
        if call.lost:
            return False
        if time.monotonic() + self.settings.heartbeat_s < call.lease_until:
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

    def _attempt(self, call: _Call) -> CallOutcome:
        run = call.run
        signing_secrets = self.owners.signing_secrets(run.owner)
        if not signing_secrets:
            return CallOutcome(error=f"owner {run.owner!r} has no signing secret", retryable_error=False)
        if run.target.get("type") == "queue":
            return self._queues().publish(QueueCall(str(run.job_id), run.scheduled_for, run.attempt,
                                                    run.target["topic"], run.payload, signing_secrets))
        return self.webhooks.call(
            WebhookCall(str(run.job_id), run.scheduled_for, run.attempt, run.target, run.payload,
                        signing_secrets,
                        # No round trip here: only whether the lease known at the check
                        # still runs, as the request is about to go out.
                        may_send=lambda: not call.lost and time.monotonic() < call.lease_until)
        )

    def _flush(self, items: list[Finished]) -> None:
        complete(self.registry, items, utcnow())
        calls = self._inflight.pop_many([item.run.run_id for item in items])
        try:  # concurrency slots go back once the outcome is on record, in one round trip
            self.limiter.release_many([(call.specs, str(call.run.run_id)) for call in calls])
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(calls))

    def _heartbeat(self, calls: list[_Call]) -> None:
        sent = time.monotonic()
        kept = lease.heartbeat(self.registry, [call.run for call in calls], utcnow())
        for call in calls:
            if call.run.run_id in kept:
                call.lease_until = sent + self.settings.lease_s
            else:  # taken back (or already completed): a call not yet made must not start
                call.lost = True
        self.limiter.renew_many([(call.specs, str(call.run.run_id)) for call in calls], self.settings.lease_s)

    def in_flight(self) -> int:
        return len(self._inflight)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait (at most `timeout_s`) for calls in flight and their completions."""
        deadline = time.monotonic() + timeout_s
        self._inflight.wait_empty(timeout_s)
        self._buffer.close(max(0.1, deadline - time.monotonic()))
        self._inflight.stop()
        self._calls.stop()


class _CallThreads:
    """`size` long-lived threads that take calls from one queue.

    Not a ThreadPoolExecutor: its submit builds a Future (with a Condition) per call
    that nobody reads, which was ~6% of a worker process's CPU under the burst
    (py-spy); a SimpleQueue put is one C call. The threads start on first use.
    """

    def __init__(self, size: int, run):
        self._size = size
        self._run = run
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()

    def put(self, call: _Call) -> None:
        if not self._threads:
            self._start()
        self._queue.put(call)

    def stop(self) -> None:
        """Let the threads end once the calls queued before this are done."""
        for _ in self._threads:
            self._queue.put(None)

    def _start(self) -> None:
        with self._start_lock:
            while len(self._threads) < self._size:
                thread = threading.Thread(target=self._loop, name=f"call-{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _loop(self) -> None:
        while (call := self._queue.get()) is not None:
            try:
                self._run(call)
            except Exception:  # _call settles every outcome; this keeps the thread alive regardless
                log.exception("a call thread failed")
