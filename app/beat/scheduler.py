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
"""

from __future__ import annotations

import logging

from celery.beat import Scheduler

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
