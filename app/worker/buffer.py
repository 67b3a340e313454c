"""The completion buffer: finished attempts written in batches, as calls finish.

Call threads `add` what they finished; one flusher thread hands the buffer to
`flush` when it holds `max_items` or its oldest item waited `max_delay_s` (~50 ms),
so a batch's fast calls are recorded without waiting for its slowest one, and the
registry sees one transaction per batch rather than one per run.

Under load the delay grows: while completions arrive at `busy_rate` (20) a second or
more (measured over the previous batch: its items over the time since the batch
before it was taken), the next batch may wait up to `busy_delay_s` (~200 ms). A
flush costs a few statements whatever its size, so at a steady load, where each
process sees a few dozen completions a second, batches of a few runs spent most of
the completion's CPU on those fixed costs; a longer wait spreads them over more
runs. Below the bar (a quiet worker) nothing waits longer than `max_delay_s`. What a
longer wait delays is the record of an outcome, and with it the claim of a recurring
job's next occurrence (claimed ahead, so only a job due again within a poll interval
or so can notice); a call's concurrency slot goes back when the call ends, and its
lease is renewed until the record is written.

A flush that fails (the database is away) keeps its items and is tried again, soon
at first (0.1 s, doubling to 2 s: app.registry.transient's pauses), for as long as
it takes: an outcome has nowhere else to go. The runs stay in flight meanwhile, so
their leases keep being extended once the database answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from app.registry.transient import FIRST_PAUSE_S, MAX_PAUSE_S

T = TypeVar("T")
log = logging.getLogger("punctual.completion")


class CompletionBuffer(Generic[T]):
    def __init__(
        self,
        flush: Callable[[list[T]], None],
        max_items: int = 200,
        max_delay_s: float = 0.05,
        busy_delay_s: float = 0.2,
        busy_rate: float = 20.0,
    ):
        self._flush = flush
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
            pause = FIRST_PAUSE_S
            while True:
                try:
                    self._flush(items)
                    break
                except Exception:  # keep the items: their leases are still extended
                    log.exception("completion flush of %d items failed; retrying in %gs", len(items), pause)
                    time.sleep(pause)
                    pause = min(MAX_PAUSE_S, pause * 2)
            with self._cond:
                self._busy = False
