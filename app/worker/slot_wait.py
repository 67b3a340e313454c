"""Waiting in the worker for a concurrency slot (app.limits: a cap bounds calls in flight).

A run that finds every slot of a cap taken does not go back to the registry at once:
its message stays unacknowledged (so a dead worker's runs come back from the broker)
and the dispatch waits up to `wait_s` (a second or two, well inside the lease) for a
slot. It looks again:

- as soon as enough of this process's calls ended and gave their slots back (the
  `SlotReleaser` releases them right at the end of the call, before the outcome is
  recorded, batched on one Redis connection, and then wakes the waiter): a batch's
  worth (`batch_size`);
- otherwise every POLL_S, which also finds slots freed by other processes.

Each try first asks how many slots each cap has free (`Limiter.free_slots`, one
cheap round trip) and admits only as many waiting runs as that, and only once they
make a batch (`batch_size`) or BATCH_WAIT_S passed since the last admission: each
admission costs a limiter call and a fenced start, whatever its size, so a burst
behind a busy cap is started in batches rather than run by run, while a run behind
a small cap still starts as soon as a slot frees.

A slot can also pass straight from a call that ended to a run waiting in the same
process (`SlotWaits.hand_over`): no release, no look, no admission, so the slot is
idle only until the waiting run's fenced start (gathered like the admissions above:
a batch, or BATCH_WAIT_S), not for a round trip to Redis and a poll. Only a run
whose caps are exactly the ending call's and that has no rate can take one (a rate
must see each start), and only while the slot's lease is known to hold well past
the waiting run's first heartbeat. The slot keeps its holder name in the limiter
(the name given at its admission): the limiter sees one slot held all along,
renewed by whichever run uses it, released by the last. A slot goes back to the
limiter all the same once it has been passed on for HAND_OVER_FOR_S since it was
admitted, so the runs waiting in other processes still get their turns.

Only a run still waiting after `wait_s` is held back to the registry, once, with
next_run_at when a slot is expected (`expected_slot_at`). A wait costs no registry
write; a retry costs the limiter one script call for all the runs waiting.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

log = logging.getLogger("punctual.limits")

# The longest a run waits in the worker for a slot before it is held back (seconds).
MAX_WAIT_S = 2.0
# How often a waiting dispatch asks again for slots freed by other processes.
POLL_S = 0.01
# Free slots that make a batch worth starting at once (and local releases that wake a
# waiting dispatch before its poll).
BATCH_RUNS = 32
# The longest a waiting run with a free slot is kept for a batch to gather: one poll.
# Its slot is idle meanwhile, which calls of 200 ms behind a cap of 200 felt: 50 ms
# gave 829-851 starts/s where 10 ms gave 866-873 (bench.limits, alternated).
BATCH_WAIT_S = 0.01
# How long the releaser lets slots of ending calls gather before one round trip gives
# them back (SlotReleaser).
RELEASE_LINGER_S = 0.005
# How long a slot may pass from call to call inside one process (since the limiter
# admitted it) before it goes back to the limiter for every process to compete for.
HAND_OVER_FOR_S = 1.0


def wait_budget_s(lease_s: float) -> float:
    """How long a run may wait in the worker for a slot: MAX_WAIT_S, and a small part
    of the lease, since the run is claimed (leased) while it waits."""
    return min(MAX_WAIT_S, lease_s / 10)


def batch_size(waiting: int, smallest_cap: int) -> int:
    """How many free slots make a try worth it at once: BATCH_RUNS, or every run
    waiting, or a quarter of the smallest cap waited for (behind a cap of 4 each
    slot counts: a batch there would only add its wait to every call)."""
    return max(1, min(waiting, BATCH_RUNS, smallest_cap // 4))


def expected_slot_at(
    now: datetime, position: int, started_per_s: float, waited_s: float, max_concurrency: int
) -> datetime:
    """When a run still waiting for a slot should come back (pure).

    `position`: how many runs of this process wait ahead of it on the same cap;
    `started_per_s`: how fast this process's waiting runs got slots while it waited.
    With slots freeing at that pace, its turn comes after position + 1 of them; when
    none freed at all in `waited_s`, calls last longer than that, so each round of
    `max_concurrency` runs is expected to take at least as long again. A turn is never
    expected later than that: a pace read from a few slots in a wait the limiter
    itself stalled (Redis paused) would otherwise put runs minutes out.
    """
    rounds = position // max(1, max_concurrency) + 1
    no_slot_came = timedelta(seconds=max(waited_s, POLL_S) * rounds)
    if started_per_s > 0:
        return now + min(timedelta(seconds=(position + 1) / started_per_s), no_slot_came)
    return now + no_slot_came


def cap_keys(specs: Sequence) -> frozenset[str]:
    """The keys of the caps among a run's limit specs."""
    return frozenset(spec.key for spec in specs if spec.max_concurrency)


def takes_handed_slots(specs: Sequence) -> frozenset[str] | None:
    """The caps under which a waiting run can take a slot straight from a call that
    ended (one with exactly these caps), or None: a run under a rate must be admitted
    by the limiter, and a run without a cap never waits."""
    if any(spec.rate_per_s for spec in specs):
        return None
    return cap_keys(specs) or None


@dataclass
class Slot:
    """A concurrency slot a run holds: under which name the limiter knows it, since
    when (time.monotonic) it is this process's, and until when its lease is known to
    run at least."""

    holder: str
    since: float
    until: float


@dataclass
class Handed:
    """A waiting run that was given the slot of a call that ended."""

    entry: tuple  # (run, specs), as it waited
    slot: Slot


class Waiting:
    """One dispatch's runs waiting for a slot, in order, and those handed one meanwhile.

    Read and changed only through its SlotWaits (under its lock)."""

    def __init__(self, entries: Iterable[tuple]):
        self.entries: list[tuple] = list(entries)
        self.handed: list[Handed] = []
        # Each run's caps for a handed slot, worked out once (by the run object's
        # identity: a run moves between lists in new tuples), not at every call's end.
        self._caps = {id(run): takes_handed_slots(specs) for run, specs in self.entries}
        self.takers: Counter = Counter(keys for keys in self._caps.values() if keys)

    def caps_of(self, entry: tuple) -> frozenset[str] | None:
        return self._caps[id(entry[0])]

    def count(self, entries: Iterable[tuple], sign: int) -> None:
        """Add (sign 1) or take out (-1) these runs from the count of takers."""
        for entry in entries:
            if keys := self.caps_of(entry):
                self.takers[keys] += sign


class SlotWaits:
    """A count of slots released by this process, the runs of this process waiting
    for a slot (each dispatch's `Waiting`), and a condition to wait on both."""

    def __init__(self):
        self._cond = threading.Condition()
        self._released = 0
        self._open: list[Waiting] = []

    @property
    def released(self) -> int:
        with self._cond:
            return self._released

    def notify(self, count: int = 1) -> None:
        with self._cond:
            self._released += count
            self._cond.notify_all()

    def wait(self, since: int, timeout_s: float, enough: int = 1, waiting: Waiting | None = None) -> int:
        """Sleep until `enough` slots were released after the count `since`, or a run of
        `waiting` was handed a slot, or for `timeout_s`; returns the count then."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._released - since >= enough or (waiting is not None and bool(waiting.handed)),
                timeout_s,
            )
            return self._released

    # -- runs waiting, and slots handed to them -----------------------------------

    def open(self, entries: Iterable[tuple]) -> Waiting:
        """Offer these (run, specs) to calls that end in this process."""
        waiting = Waiting(entries)
        with self._cond:
            self._open.append(waiting)
        return waiting

    def close(self, waiting: Waiting) -> tuple[list[Handed], list[tuple]]:
        """Stop offering `waiting`'s runs: (those handed a slot, those still waiting)."""
        with self._cond:
            self._open.remove(waiting)
            handed, waiting.handed = waiting.handed, []
            entries, waiting.entries = waiting.entries, []
            waiting.takers.clear()
            return handed, entries

    def hand_over(self, specs: Sequence, slot: Slot, now: float, margin_s: float) -> bool:
        """A call under `specs` ended holding `slot`: give it to the first run waiting
        under exactly the same caps, if there is one, the slot's lease is known to run
        past `now` + `margin_s`, and the slot has not been passed on for too long.
        False: nobody took it, and it goes back to the limiter."""
        if slot.until <= now + margin_s or now - slot.since >= HAND_OVER_FOR_S:
            return False
        keys = cap_keys(specs)
        with self._cond:
            for waiting in self._open:
                if not waiting.takers[keys]:
                    continue
                for i, entry in enumerate(waiting.entries):
                    if waiting.caps_of(entry) == keys:
                        del waiting.entries[i]
                        waiting.takers[keys] -= 1
                        waiting.handed.append(Handed(entry, slot))
                        self._cond.notify_all()
                        return True
        return False

    def take_handed(self, waiting: Waiting, enough: int = 1, timeout_s: float = 0.0) -> list[Handed]:
        """The runs of `waiting` handed a slot, once there are `enough` of them or after
        `timeout_s` (each costs a fenced start, one statement for all: a burst's calls
        end by the dozen, and starting each alone cost the registry more per run)."""
        with self._cond:
            if timeout_s > 0:
                self._cond.wait_for(lambda: len(waiting.handed) >= enough, timeout_s)
            handed, waiting.handed = waiting.handed, []
            return handed

    def take(self, waiting: Waiting, free: dict[str, int]) -> list[tuple]:
        """Take out the runs to try now (pick_runs over what still waits)."""
        with self._cond:
            ready, waiting.entries = pick_runs(waiting.entries, free)
            waiting.count(ready, -1)
            return ready

    def put_back(self, waiting: Waiting, entries: list[tuple]) -> None:
        """Runs taken out that still wait, ahead of the rest (they waited longer)."""
        if not entries:
            return
        with self._cond:
            waiting.entries[:0] = entries
            waiting.count(entries, 1)

    def entries(self, waiting: Waiting) -> list[tuple]:
        with self._cond:
            return list(waiting.entries)


def pick_runs(waiting: list, free: dict[str, int]) -> tuple[list, list]:
    """(runs to try now, runs left waiting): in order, a run whose every cap still has
    a free slot in `free` (cap key -> free slots) is tried and takes one of each."""
    budget = dict(free)
    now, later = [], []
    for entry in waiting:
        keys = [spec.key for spec in entry[1] if spec.max_concurrency]
        if all(budget.get(key, 0) > 0 for key in keys):
            for key in keys:
                budget[key] -= 1
            now.append(entry)
        else:
            later.append(entry)
    return now, later


class SlotReleaser:
    """Gives concurrency slots back as calls end, batched, then wakes the waiters.

    Call threads `put` what they hold; one thread releases everything queued so far
    in one round trip (`release`) and notifies `waits`. A failed release is only
    logged: the slots' leases run out by themselves.
    """

    def __init__(self, release: Callable[[list], None], waits: SlotWaits):
        self._release = release
        self._waits = waits
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="slot-releaser", daemon=True)
        self._thread.start()

    def put(self, item) -> None:
        self._queue.put(item)

    def put_many(self, items: Iterable) -> None:
        for item in items:
            self._queue.put(item)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            items, stopping = ([] if first is None else [first]), first is None
            if not stopping:
                # Let the calls ending meanwhile join this round trip: a slot comes back
                # at most RELEASE_LINGER_S later, well inside the POLL_S a waiting run
                # sleeps between looks, and a burst's releases travel by the dozen.
                time.sleep(RELEASE_LINGER_S)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    items.append(item)
            if items:
                try:
                    self._release(items)
                except Exception:  # a slot's lease runs out on its own
                    log.exception("releasing %d concurrency slots failed", len(items))
                self._waits.notify(len(items))
            if stopping:
                return
