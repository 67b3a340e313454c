"""Turns: which waiting dispatch message a worker starts next.

A worker holds every dispatch message whose instant has come until one of its
processes is free for it (app.tasks.turnstile). Under a burst that is thousands of
messages, and the order in which they are served decides who is late:

1. Lanes. Messages of the recurring lane (they hold occurrences of cron and interval
   jobs: app.lifecycle.message) go before one-off messages, so that a job every few
   seconds keeps its pace while a burst of one-offs drains. The lane is small by
   nature (a recurring job has one occurrence in flight at a time), so it cannot
   starve the other.
2. Owners. Within a lane, the owner that has been served the fewest runs goes next
   (start-time fair queueing by runs served): an owner with ten runs due is not
   served after another owner's hundred thousand. An owner that starts waiting again
   begins no lower than the owner served last (the virtual clock), so an idle spell
   banks no credit, while an owner served a moment ago keeps what it was served.
3. Within an owner and lane, messages go in the order they came (their instants).

Pure: no Celery here, no clock; the turnstile calls `push`, `pop` and nothing else.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# Lanes in the order they are served.
LANES = ("recurring", "one-off")
# How many owners' service a lane remembers beyond those waiting. An owner that waits
# no more is remembered (served a moment ago, it must not come back ahead of the others
# by what it was just served; it is never more than one message behind the clock) until
# the lane is empty and remembers more than this many.
REMEMBER_OWNERS = 1000


@dataclass
class _Lane(Generic[T]):
    waiting: dict[str, deque[tuple[T, int]]] = field(default_factory=dict)  # owner -> (item, runs)
    served: dict[str, float] = field(default_factory=dict)  # owner -> runs served (virtual)
    clock: float = 0.0  # the service level of the owner served last
    # The owners waiting, each once, by (runs served, when it came to that level): the
    # next to serve on top, in log(owners) (a process's runs due at one instant may be
    # those of hundreds of owners, each served one at a time).
    order: list[tuple[float, int, str]] = field(default_factory=list)


class Turns(Generic[T]):
    def __init__(self) -> None:
        self._lanes: dict[str, _Lane[T]] = {lane: _Lane() for lane in LANES}
        self._count = 0
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return self._count

    def push(self, item: T, lane: str, owner: str, runs: int) -> None:
        """`item` waits: a message of `lane` (an unknown lane counts as one-off) charged
        to `owner`, holding `runs` runs."""
        queue = self._lanes.get(lane) or self._lanes[LANES[-1]]
        waiting = queue.waiting.get(owner)
        if waiting is None:
            waiting = queue.waiting[owner] = deque()
            # Waiting again (or for the first time): level with the owners served now.
            queue.served[owner] = max(queue.served.get(owner, 0.0), queue.clock)
            heapq.heappush(queue.order, (queue.served[owner], next(self._arrivals), owner))
        waiting.append((item, max(1, runs)))
        self._count += 1

    def pop(self) -> T | None:
        """The next message to start, or None when none waits."""
        for name in LANES:
            queue = self._lanes[name]
            if not queue.waiting:
                continue
            _, _, owner = heapq.heappop(queue.order)
            waiting = queue.waiting[owner]
            item, runs = waiting.popleft()
            queue.clock = queue.served[owner]
            queue.served[owner] += runs
            if waiting:
                heapq.heappush(queue.order, (queue.served[owner], next(self._arrivals), owner))
            else:
                del queue.waiting[owner]
                if not queue.waiting and len(queue.served) > REMEMBER_OWNERS:
                    # Nobody waits in this lane, so nobody is owed anything: start afresh
                    # rather than remember every owner ever served.
                    queue.served.clear()
                    queue.clock = 0.0
            self._count -= 1
            return item
        return None

    def served(self, lane: str, owner: str) -> float | None:
        """The runs `owner` has been served in `lane` (virtual), if it is remembered."""
        return self._lanes[lane].served.get(owner)

    def waiting_by_lane(self) -> dict[str, int]:
        return {name: sum(len(w) for w in lane.waiting.values()) for name, lane in self._lanes.items()}
