"""The completion buffer: finished attempts written in batches, as calls finish.

Call threads `add` what they finished; one flusher thread hands the buffer to
`flush` when it holds `max_items` or its oldest item waited `max_delay_s` (~50 ms),
so a batch's fast calls are recorded without waiting for its slowest one, and the
registry sees one transaction per batch rather than one per run.

Under load the delay grows: while completions arrive at `busy_rate` (20) a second or
more (measured over the previous batch: its items over the time since the batch
before it was taken), the next batch may wait up to `busy_delay_s` (~500 ms). A
flush costs a few statements whatever its size, so at a steady load, where each
process sees a few dozen completions a second, batches of a few runs spent most of
the completion's CPU on those fixed costs; a longer wait spreads them over more
runs. Below the bar (a quiet worker) nothing waits longer than `max_delay_s`. What a
longer wait delays is the record of an outcome, and with it the claim of a recurring
job's next occurrence (claimed ahead, so only a job due again within a poll interval
or so can notice); a call's concurrency slot goes back when the call ends, and its
lease is renewed until the record is written.

A flush that fails while the registry is away is tried again, whole, for as long as
that lasts (the runs' leases are kept meanwhile); one that fails for any other reason
is halved down to the item at fault (`_write`): a batch never waits on one run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from app import metrics
from app.registry.engines import is_fence_error
from app.registry.transient import FIRST_PAUSE_S, MAX_PAUSE_S, first_line, is_transient

T = TypeVar("T")
log = logging.getLogger("punctual.completion")
# The most completions one flush takes once its wait is over (docs/design.md states
# what a killed worker can leave unrecorded from it).
MAX_ITEMS = 200


class CompletionBuffer(Generic[T]):
    def __init__(
        self,
        flush: Callable[[list[T]], None],
        max_items: int = MAX_ITEMS,
        max_delay_s: float = 0.05,
        busy_delay_s: float = 0.5,
        busy_rate: float = 20.0,
        salvage: Callable[[T, Exception], T | None] | None = None,
        give_up: Callable[[T], object] | None = None,
        name: Callable[[T], str] = repr,
    ):
        """`salvage(item, failure)`: what to write instead of an item that cannot be
        written (None: nothing); `give_up(item)`: called for an item left unwritten;
        `name(item)`: how the log line names it."""
        self._flush = flush
        self._salvage = salvage
        self._give_up = give_up
        self._name = name
        self.max_items = max_items
        self.max_delay_s = max_delay_s
        self.busy_delay_s = max(busy_delay_s, max_delay_s)
        self.busy_rate = busy_rate
        self._items: list[T] = []
        self._first_at: float | None = None
        self._delay_s = max_delay_s  # this batch's: max_delay_s, or busy_delay_s under load
        self._taken_at = float("-inf")  # when the previous batch was taken
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="completion-flusher", daemon=True)
        self._thread.start()

    def add(self, item: T) -> None:
        with self._cond:
            self._items.append(item)
            if self._first_at is None:  # the flusher sleeps without a deadline until now
                self._first_at = time.monotonic()
                self._cond.notify()
            elif len(self._items) >= self.max_items:
                self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._items) + (1 if self._busy else 0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what is left and stop the flusher (waits at most `timeout_s`)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _take(self) -> list[T] | None:
        with self._cond:
            while True:
                if self._items:
                    now = time.monotonic()
                    waited = now - (self._first_at or 0)
                    if len(self._items) >= self.max_items or waited >= self._delay_s or self._closing:
                        items, self._items, self._first_at = self._items, [], None
                        busy = len(items) >= self.busy_rate * (now - self._taken_at)
                        self._delay_s = self.busy_delay_s if busy else self.max_delay_s
                        self._taken_at = now
                        self._busy = True
                        return items
                    self._cond.wait(self._delay_s - waited)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()

    def _loop(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            self._write(items)
            with self._cond:
                self._busy = False

    def _write(self, items: list[T]) -> None:
        """Flush `items`. A failure that passes with time (app.registry.transient: the
        database is away) is retried, the batch whole, soon at first (0.1 s, doubling
        to 2 s), for as long as it takes: an outcome has nowhere else to go. Any other
        failure halves the batch, each half flushed on its own, down to the one item
        that fails: that item is written as what `salvage` makes of it (a failed
        attempt saying why), and when even that fails it is given up (`give_up`: its
        lease runs out and the janitor takes it back), counted in
        punctual_completions_given_up_total with one log line."""
        parts = [items]
        while parts:
            part = parts.pop()
            failure = self._flush_until_written(part)
            if failure is None:
                continue
            if len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]  # the first half next: the order they came in
            else:
                self._settle_alone(part[0], failure)

    def _flush_until_written(self, items: list[T]) -> Exception | None:
        """`flush(items)`, again after each failure that passes with time (the database
        is away, a shard is being moved) for as long as those last; the first failure
        that will not pass is returned."""
        pause = FIRST_PAUSE_S
        failures = 0
        while True:
            try:
                self._flush(items)
            except Exception as exc:
                if not passes(exc):
                    return exc
                failures += 1
                if failures == 1:  # one line for an outage, not a traceback every try
                    log.warning(
                        "completion flush of %d items failed (%s: %s); retrying until it passes",
                        len(items),
                        type(exc).__name__,
                        first_line(exc),
                    )
                time.sleep(pause)
                pause = min(MAX_PAUSE_S, pause * 2)
                continue
            if failures:
                log.warning("completion flush of %d items passed after %d failures", len(items), failures)
            return None

    def _settle_alone(self, item: T, failure: Exception) -> None:
        """One item that fails on its own: written as what `salvage` makes of it, or
        given up (counted, one log line) when that is nothing or fails too."""
        replacement = self._salvage(item, failure) if self._salvage is not None else None
        if replacement is not None:
            again = self._flush_until_written([replacement])
            if again is None:
                log.warning(
                    "%s could not be recorded (%s: %s); recorded as a failed attempt instead",
                    self._name(item),
                    type(failure).__name__,
                    first_line(failure),
                )
                return
            failure = again
        metrics.COMPLETIONS_GIVEN_UP.inc()
        log.error(
            "%s could not be recorded (%s: %s); given up, its lease will run out",
            self._name(item),
            type(failure).__name__,
            first_line(failure),
        )
        if self._give_up is not None:
            self._give_up(item)


def passes(exc: BaseException) -> bool:
    """Whether a flush's failure passes with time: the registry is away for a moment,
    or a shard's move held the write back for longer than its wait."""
    return is_transient(exc) or is_fence_error(exc)
