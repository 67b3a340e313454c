"""Beat's scheduler: Celery's in-memory Scheduler, without its early wake and its per-tick log lines.

Celery's Scheduler wakes 10 ms before an entry is due (`adjust`'s drift), finds it
not due yet, puts it back at "now" and is called again at once: it spins for those
10 ms before every entry it sends. Punctual's schedule sends a poll to each shard
every PUNCTUAL_POLL_INTERVAL_S and a sweep every few seconds (app.beat.schedule),
18 or so entries a second with 16 shards, so an idle beat spent most of its CPU
spinning. Here a tick sleeps until the entry is due; `time.sleep` does not wake
early, so the entry is due when it wakes (or a few microseconds later, one short
sleep more).

"Sending due task" is logged at DEBUG, not INFO: at INFO it was 18 lines a second
that said nothing the liveness line (app.beat.process, once a minute, how many of
each task were sent) does not, and formatting them was a large share of beat's CPU.
A failure to send is still logged at ERROR, as Celery does.

GatedScheduler (the one celeryconfig names) sends a poll or a sweep only to a shard
with work for it (app.beat.gate).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from celery.beat import Scheduler

from app.beat.gate import Gate
from app.core.timefmt import utcnow
from app.pollers.watch import ShardWork, next_work
from app.registry.engines import registry_for
from app.settings import get_settings
from app.tasks.routing import POLL_TASK, SWEEP_TASK

log = logging.getLogger("punctual.beat")


class TickScheduler(Scheduler):
    def adjust(self, n, drift=0.0):
        """The delay until an entry is due, as it is (Celery subtracts 10 ms)."""
        return n

    def schedules_equal(self, old_schedules, new_schedules):
        """Whether the heap must be rebuilt: only when the entry names changed. The
        schedule is made once from Settings and never edited while beat runs (no
        schedule file), so Celery's comparison of every field of every entry, at every
        tick, only ever found them equal."""
        if old_schedules is None or new_schedules is None:
            return old_schedules is new_schedules
        return old_schedules.keys() == new_schedules.keys()

    def apply_entry(self, entry, producer=None):
        log.debug("sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception:  # one entry that cannot be sent must not stop beat
            log.error("beat: sending %s (%s) failed", entry.name, entry.task, exc_info=True)


class GatedScheduler(TickScheduler):
    """Beat's scheduler: rounds of polls and sweeps, each sent only to a shard with
    work for it (app.beat.gate).

    Its schedule is app.beat.schedule's: a poll and a sweep entry per shard, each
    with its interval. Instead of Celery's heap of entries (an entry popped, checked,
    copied and pushed back for each shard every interval, most of an idle beat's
    CPU), a tick is a round: every poll interval each shard's poll is sent or left
    out, and each sweep whose interval passed likewise. An entry of any other task
    is sent as it falls due, by the heap of the entries that are not rounds'.
    """

    _gate: Gate | None = None
    _rounds: Rounds | None = None

    def tick(self, *args, **kwargs):
        rounds = self._rounds or self._make_rounds()
        now = time.monotonic()
        if now >= rounds.next_at:
            self._round(rounds, now)
        wait = max(0.0, rounds.next_at - time.monotonic())
        if rounds.others:
            wait = min(wait, super().tick(*args, **kwargs))
        return min(wait, self.max_interval)

    def _round(self, rounds: Rounds, now: float) -> None:
        gate = self._gate or self._make_gate()
        instant = utcnow()
        for shard, entry in rounds.polls.items():
            self._send_if(gate.poll(shard, instant), entry)
        for shard, entry in rounds.sweeps.items():
            if now >= rounds.sweep_at.get(shard, now):
                rounds.sweep_at[shard] = now + rounds.sweep_every_s[shard]
                self._send_if(gate.sweep(shard, instant), entry)
        # On the interval's grid; from now when beat fell a whole interval behind.
        rounds.next_at += rounds.every_s
        if rounds.next_at <= now:
            rounds.next_at = now + rounds.every_s

    def _send_if(self, wanted: bool, entry) -> None:
        if wanted:
            self.apply_entry(entry, producer=self.producer)
        else:
            log.debug("not sending %s (%s): no work for it", entry.name, entry.task)

    def _make_rounds(self) -> Rounds:
        rounds = Rounds()
        for name, entry in list(self.schedule.items()):
            shard = (entry.kwargs or {}).get("shard")
            every = getattr(entry.schedule, "seconds", None)
            if shard is None or every is None or entry.task not in (POLL_TASK, SWEEP_TASK):
                continue
            if entry.task == POLL_TASK:
                rounds.polls[shard] = entry
                rounds.every_s = min(rounds.every_s, every)
            else:
                rounds.sweeps[shard] = entry
                rounds.sweep_every_s[shard] = every
            del self.schedule[name]  # the heap keeps the other entries only
        rounds.others = bool(self.schedule)
        rounds.next_at = time.monotonic()
        self._rounds = rounds
        return rounds

    def _make_gate(self) -> Gate:
        settings = get_settings()
        self._gate = Gate(settings, functools.partial(read_work, registry_for(settings)))
        return self._gate


@dataclass
class Rounds:
    polls: dict[int, Any] = field(default_factory=dict)  # shard -> its poll entry
    sweeps: dict[int, Any] = field(default_factory=dict)
    sweep_every_s: dict[int, float] = field(default_factory=dict)
    sweep_at: dict[int, float] = field(default_factory=dict)  # monotonic; absent: at the next round
    every_s: float = float("inf")
    next_at: float = 0.0
    others: bool = False


def read_work(registry) -> dict[int, ShardWork | None]:
    """Every shard's work, one statement per database; a fenced shard's is unknown (a
    move's fence ends its polls quietly; they are sent as without the gate)."""
    routing = registry.routing()
    work: dict[int, ShardWork | None] = {}
    for index, engine in enumerate(registry.engines):
        shards = [s for s in routing.shards_of(index) if not routing.fenced(s)]
        if shards:
            with engine.connect() as conn:
                work.update(next_work(conn, shards))
    return work
