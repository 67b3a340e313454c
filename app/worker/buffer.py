"""The completion buffer: finished attempts written in batches, as calls finish.

Call threads `add` what they finished; one flusher thread hands the buffer to
`flush` when it holds `max_items` or its oldest item waited `max_delay_s` (~50 ms),
so a batch's fast calls are recorded without waiting for its slowest one, and the
registry still sees one transaction per ~200 completions rather than one per run.

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
    def __init__(self, flush: Callable[[list[T]], None], max_items: int = 200, max_delay_s: float = 0.05):
        self._flush = flush
        self.max_items = max_items
        self.max_delay_s = max_delay_s
        self._items: list[T] = []
        self._first_at: float | None = None
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
                    waited = time.monotonic() - (self._first_at or 0)
                    if len(self._items) >= self.max_items or waited >= self.max_delay_s or self._closing:
                        items, self._items, self._first_at = self._items, [], None
                        self._busy = True
                        return items
                    self._cond.wait(self.max_delay_s - waited)
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
