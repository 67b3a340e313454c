"""The runs whose calls are in flight in this process, and the heartbeat that keeps
their leases.

Every PUNCTUAL_HEARTBEAT_S a daemon thread hands the current set to `beat`, which
extends their leases (leased_until = now + PUNCTUAL_LEASE_S, fenced by the token,
batched) and their concurrency slots. A run leaves the set once its completion is
written, so the lease is kept until then.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("punctual.heartbeat")


class InFlight(Generic[T]):
    def __init__(self, beat: Callable[[list[T]], None], interval_s: float):
        self._beat = beat
        self.interval_s = interval_s
        self._items: dict[uuid.UUID, T] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def add(self, key: uuid.UUID, item: T) -> None:
        with self._cond:
            self._items[key] = item

    def pop_many(self, keys: list[uuid.UUID]) -> list[T]:
        """Remove these runs (their completions are written) and return them."""
        with self._cond:
            found = [item for item in (self._items.pop(key, None) for key in keys) if item is not None]
            if not self._items:
                self._cond.notify_all()
            return found

    def __contains__(self, key: uuid.UUID) -> bool:
        with self._cond:
            return key in self._items

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def wait_empty(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._cond:
                current = list(self._items.values())
            if not current:
                continue
            try:
                self._beat(current)
            except Exception:  # a missed beat is retried at the next interval
                log.exception("heartbeat of %d runs failed", len(current))
