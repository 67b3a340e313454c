"""The dispatch turnstile: a worker hands its processes dispatch messages in fair turns.

Celery hands a message to its pool as soon as the message may run: at once, or at
its eta for runs claimed ahead. Under a burst every message of the burst may run at
the same instant, and the pool queues them first come, first served: a recurring
job's next occurrence, or another owner's few runs due a moment later, wait behind
the whole burst. The turnstile sits between the consumer and the pool (a consumer
bootstep that wraps `on_task_request`, the one call through which Celery hands a
request to its pool) and keeps at most one dispatch message per pool process in the
pool; the others wait in the turnstile, and each time a dispatch ends the next one is
chosen by app.worker.turns (the recurring lane first, then the owner served least).
It reads the lane and the owner from the message's headers
(app.lifecycle.message.message_headers), not from its body.

Nothing about delivery changes: a message waiting in the turnstile is unacknowledged, as
it would be in the pool's queue, so a worker that dies hands it back to the broker
and another worker starts its runs at once (fenced). Polls and sweeps pass through
a turnstile of their own, which keeps one process free of them (`ticks_in_pool`). The
step also keeps the consumer's widened prefetch window reaching the broker
(`settle_prefetch`), without which a worker holding a burst claimed ahead took its
messages a few a second.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from app.lifecycle.message import LANE_HEADER, ONE_OFF_LANE, OWNER_HEADER, RUNS_HEADER
from app.tasks.routing import DISPATCH_TASK, POLL_TASK, SWEEP_TASK
from app.worker.turns import Turns

log = logging.getLogger("punctual.turnstile")


# How far the turnstile widens the consumer's prefetch window, at most (messages). A message
# waiting here is unacknowledged, so it fills the window (prefetch 1 per process:
# celeryconfig). Were the window not widened, nothing published after a burst's
# instant would reach this worker until its backlog was gone: not the polls (so no
# claim, and no next occurrence of a recurring job, for the whole drain), not another
# owner's runs, not the rest of a burst claimed late. So while messages wait here the
# window is widened by as many, plus one per process, which keeps room for what comes
# next; Celery widens it the same way for each message it holds for its eta. The bound
# keeps one worker from taking a whole queue (a message holds up to 100 runs).
HOLD_MAX = 1000


class Turnstile:
    """At most `limit` dispatch requests in the pool; the rest wait their turn.

    `submit(request)` hands a request to the pool. `done(request)` must be called once
    when it has ended, whatever the outcome (the step wraps the request's callbacks).
    Safe from any thread, and re-entrant: a pool that runs a request inside `submit`
    (solo) calls `done` from within it, and the loop below, not a nested one, goes on.
    """

    def __init__(
        self,
        limit: int,
        submit: Callable[[Any], None],
        prefetch: Callable[[int], None] = lambda change: None,
        hold_max: int = HOLD_MAX,
    ):
        """`prefetch(change)` widens (or narrows) the consumer's prefetch window by
        `change` messages: while messages wait here, by their number plus `limit`, up
        to `hold_max` (HOLD_MAX)."""
        self.limit = max(1, limit)
        self._submit = submit
        self._prefetch = prefetch
        self._hold_max = hold_max
        self._turns: Turns[Any] = Turns()
        self._lock = threading.Lock()
        self._active = 0
        self._pumping = False
        self._widened = 0  # how far the prefetch window is widened now
        self._closed = False

    def reopen(self) -> int:
        """Hand the pool messages again, dropping what waited here unsent: the consumer
        (re)started on a new connection after a lost one, the broker hands those
        messages out again, and the new connection's prefetch window starts unwidened.
        Returns how many were dropped."""
        with self._lock:
            dropped = len(self._turns)
            self._turns = Turns()
            self._widened = 0
            self._closed = False
        return dropped

    def close(self) -> None:
        """Hand the pool nothing more (the worker is stopping): what waits here stays
        unacknowledged, and the broker hands it out again when the connection closes."""
        with self._lock:
            self._closed = True

    def offer(self, request: Any, lane: str, owner: str, runs: int) -> None:
        with self._lock:
            self._turns.push(request, lane, owner, runs)
        self._pump()

    def done(self) -> None:
        with self._lock:
            self._active -= 1
        self._pump()

    def waiting(self) -> int:
        with self._lock:
            return len(self._turns)

    def _pump(self) -> None:
        with self._lock:
            if self._pumping:  # an outer call's loop sees the change
                return
            self._pumping = True
        while True:
            with self._lock:
                request = self._turns.pop() if self._active < self.limit and not self._closed else None
                if request is None:
                    self._pumping = False
                    waiting = len(self._turns)
                    change = (min(waiting + self.limit, self._hold_max) if waiting else 0) - self._widened
                    self._widened += change
                    break
                self._active += 1
            try:
                self._submit(request)
            except Exception:  # Celery logs its own failures; the slot must not leak
                log.exception("handing a dispatch message to the pool failed")
                with self._lock:
                    self._active -= 1
        if change:
            self._prefetch(change)


def ticks_in_pool(processes: int) -> int:
    """How many polls and sweeps a worker of `processes` pool processes runs at once:
    all but one process, so that one always starts dispatch messages. A poll claims
    batch after batch for up to PUNCTUAL_POLL_BUDGET_S while a burst is being claimed,
    and beat sends one per shard every second: unbounded, the polls took every process
    and a run due meanwhile (another owner's, or the burst's own) waited seconds behind
    them, although its message was first in the turnstile."""
    return max(1, processes - 1)


class TurnstileStep(bootsteps.StartStopStep):
    """The consumer bootstep (app.celery adds it) that puts turnstiles in front of the pool:
    one for dispatch messages (in turns), one for polls and sweeps (first come, first
    served, `ticks_in_pool` at a time)."""

    def __init__(self, c, **kwargs):
        super().__init__(c, **kwargs)
        handle = c.on_task_request  # hands a request to the pool (WorkController._process_task)
        self.dispatches: Turnstile | None = None
        self.ticks: Turnstile | None = None

        def submit(request) -> None:
            handle(request)

        def processes() -> int:
            return getattr(c.pool, "limit", None) or 1

        def on_task_request(request) -> None:
            if request.type in (POLL_TASK, SWEEP_TASK):
                if self.ticks is None:
                    self.ticks = Turnstile(ticks_in_pool(processes()), submit, functools.partial(_widen, c))
                _when_ended(request, self.ticks.done)
                self.ticks.offer(request, ONE_OFF_LANE, "", 1)
                return
            if request.type != DISPATCH_TASK:
                handle(request)
                return
            if self.dispatches is None:
                # Created on first use: the pool's size and the QoS are known by then.
                self.dispatches = Turnstile(processes(), submit, functools.partial(_widen, c))
            _when_ended(request, self.dispatches.done)
            headers = request.request_dict
            self.dispatches.offer(
                request,
                headers.get(LANE_HEADER) or ONE_OFF_LANE,
                headers.get(OWNER_HEADER) or "",
                int(headers.get(RUNS_HEADER) or 1),
            )

        # Before the Tasks step builds its strategies, which capture this attribute.
        c.on_task_request = on_task_request
        self._settle: Callable[[], None] | None = None

    def start(self, c) -> None:
        """The consumer (re)starts: after a lost connection Celery stops and starts its
        steps again, and the messages held here belong to the channel that died."""
        if c.hub is not None and self._settle not in c.hub.on_tick:
            self._settle = functools.partial(settle_prefetch, c)
            c.hub.on_tick.add(self._settle)
        dropped = sum(line.reopen() for line in (self.dispatches, self.ticks) if line is not None)
        if dropped:
            log.warning("dropped %d messages of a lost connection; the broker sends them again", dropped)

    def stop(self, c) -> None:
        """The worker is stopping: a warm shutdown waits for what is in the pool, not
        for everything the turnstile holds."""
        for line in (self.dispatches, self.ticks):
            if line is not None:
                line.close()

    shutdown = stop


def _widen(c, change: int) -> None:
    """Widen the consumer's prefetch window by `change` messages (narrow it if negative),
    as Celery does for messages held for their eta; applied by the consumer's loop."""
    if c.qos is None:
        return
    if change > 0:
        c.qos.increment_eventually(change)
    else:
        c.qos.decrement_eventually(-change)


# How many times one turn of the consumer's loop sends the prefetch window again while
# messages received meanwhile keep changing it (settle_prefetch).
SETTLE_ROUNDS = 50


def settle_prefetch(c) -> None:
    """Send the consumer's prefetch window until the broker has the current one; called
    on every turn of the consumer's loop, right before it waits for the sockets.

    Celery sends a changed window once per turn of its loop, and `basic.qos` waits for
    the broker's answer, reading and handling whatever messages arrive first. Each
    message held for its eta (or waiting in the turnstile) widens the window again, but
    nothing sends that: the window the broker has is full, so no message comes to end
    the wait for the sockets, and the loop sleeps until its next timer (up to 10 s,
    often the next eta). A worker holding a burst claimed ahead then took only a
    few messages a second, and the polls queued behind them expired, so no claim ran
    until the burst's instant. Sending the window until it stops changing keeps
    messages flowing as fast as the broker hands them out."""
    qos = c.qos
    if qos is None:
        return
    for _ in range(SETTLE_ROUNDS):
        if qos.prev == qos.value:
            return
        qos.update()


def _when_ended(request, ended: Callable[[], None]) -> None:
    """Call `ended` once when `request` ends: its success or failure callback (a pool
    passes them on from the instance), a child lost included, or when it is found
    revoked. An expired poll is found so on its way to the pool, possibly long after
    it left the turnstile (the pool's semaphore may hold it), and then no callback comes:
    without this its place in the turnstile was lost for good, and once every place was,
    the worker stopped polling."""
    fired = threading.Event()

    def once() -> None:
        if not fired.is_set():
            fired.set()
            ended()

    success, failure = request.on_success, request.on_failure

    def on_success(*args, **kwargs):
        try:
            return success(*args, **kwargs)
        finally:
            once()

    def on_failure(*args, **kwargs):
        try:
            return failure(*args, **kwargs)
        finally:
            once()

    revoked = request.revoked

    def revoked_or_expired() -> bool:
        if revoked():
            once()
            return True
        return False

    request.on_success = on_success
    request.on_failure = on_failure
    request.revoked = revoked_or_expired
