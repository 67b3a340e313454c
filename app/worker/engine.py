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
from app.services.owners import OwnerDirectory
from app.settings import Settings
from app.worker.queue_publisher import QueueCall, QueuePublisher
from app.worker.webhook import WebhookCall, WebhookCaller
from app.core.timefmt import utcnow
from app.logs import log_context

log = logging.getLogger("punctual.dispatch")


@dataclass(frozen=True)
class DispatchReport:
    started: int = 0
    held: int = 0
    stale: int = 0


@dataclass(frozen=True)
class _Call:
    run: DispatchRun
    specs: list


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
        admissions = self.limiter.acquire_many(
            [(spec, str(run.run_id)) for run, spec in zip(part, specs)], now, settings.lease_s
        )
        admitted = [_Call(run, spec) for run, spec, admission in zip(part, specs, admissions) if admission.admitted]
        held = [(run, admission.retry_instant()) for run, admission in zip(part, admissions) if not admission.admitted]
        started_ids = lease.start(self.registry, [call.run for call in admitted], now) if admitted else set()
        calls, stale = [], 0
        for call in admitted:
            if call.run.run_id in started_ids:
                calls.append(call)
                metrics.START_LATENESS.observe(max(0.0, (now - call.run.scheduled_for).total_seconds()))
                metrics.RUNS_STARTED.labels(str(call.run.shard)).inc()
        unstarted = [(call.specs, str(call.run.run_id)) for call in admitted if call.run.run_id not in started_ids]
        if unstarted:  # a duplicated message, or a lease lost before the start: nothing is called
            stale = len(unstarted)
            self.limiter.release_many(unstarted)
        if stale:
            metrics.STALE_COMPLETIONS.inc(stale)
        if held:
            metrics.RUNS.labels("held").inc(lease.hold(self.registry, held, now))
        return calls, len(held), stale

    def _call(self, call: _Call) -> None:
        run = call.run
        # Every line logged while this run is called (here, in the webhook caller, the
        # limiter, the libraries) names it (app.logs).
        with log_context(job_id=str(run.job_id), run_id=str(run.run_id), shard=run.shard, attempt=run.attempt,
                         owner=run.owner):
            try:
                outcome = self._attempt(run)
            except Exception as exc:  # a bug here must still settle the run, as a retryable failure
                log.exception("call of run %s failed", run.run_id)
                outcome = CallOutcome(error=f"internal error: {type(exc).__name__}: {exc}")
            finally:
                self._slots.release()
            log.debug("run %s called: status %s, error %s", run.run_id, outcome.status_code, outcome.error)
        self._buffer.add(Finished(run, outcome, utcnow()))

    def _attempt(self, run: DispatchRun) -> CallOutcome:
        secret = self.owners.signing_secret(run.owner)
        if secret is None:
            return CallOutcome(error=f"owner {run.owner!r} has no signing secret", retryable_error=False)
        if run.target.get("type") == "queue":
            return self._queues().publish(
                QueueCall(str(run.job_id), run.scheduled_for, run.attempt, run.target["topic"], run.payload, secret)
            )
        return self.webhooks.call(
            WebhookCall(str(run.job_id), run.scheduled_for, run.attempt, run.target, run.payload, secret)
        )

    def _flush(self, items: list[Finished]) -> None:
        complete(self.registry, items, utcnow())
        calls = self._inflight.pop_many([item.run.run_id for item in items])
        try:  # concurrency slots go back once the outcome is on record, in one round trip
            self.limiter.release_many([(call.specs, str(call.run.run_id)) for call in calls])
        except Exception:  # a slot's lease runs out on its own
            log.exception("releasing %d concurrency slots failed", len(calls))

    def _heartbeat(self, calls: list[_Call]) -> None:
        lease.heartbeat(self.registry, [call.run for call in calls], utcnow())
        self.limiter.renew_many([(call.specs, str(call.run.run_id)) for call in calls],
                                        self.settings.lease_s)

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
