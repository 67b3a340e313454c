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

    def apply_entry(self, entry, producer=None):
        log.debug("sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except Exception:  # one entry that cannot be sent must not stop beat
            log.error("beat: sending %s (%s) failed", entry.name, entry.task, exc_info=True)


class GatedScheduler(TickScheduler):
    """TickScheduler whose poll and sweep ticks go only to shards with work for them
    (app.beat.gate); any other entry is sent as it falls due."""

    _gate: Gate | None = None

    def apply_entry(self, entry, producer=None):
        shard = (entry.kwargs or {}).get("shard")
        if shard is not None and entry.task in (POLL_TASK, SWEEP_TASK):
            gate = self._gate or self._make_gate()
            now = utcnow()
            wanted = gate.poll(shard, now) if entry.task == POLL_TASK else gate.sweep(shard, now)
            if not wanted:
                log.debug("not sending %s (%s): no work for it", entry.name, entry.task)
                return
        super().apply_entry(entry, producer)

    def _make_gate(self) -> Gate:
        settings = get_settings()
        self._gate = Gate(settings, functools.partial(read_work, registry_for(settings)))
        return self._gate


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
