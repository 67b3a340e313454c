"""Which of beat's ticks are sent: a poll or a sweep only to a shard with work for it.

Beat's schedule (app.beat.schedule) still ticks every shard every
PUNCTUAL_POLL_INTERVAL_S (and sweeps every few seconds), but a tick is sent only
when the registry says the shard has work for it (app.pollers.watch, read at most
once per interval for all shards of a database, one statement each):

- a poll: a scheduled job due within PUNCTUAL_CLAIM_AHEAD_S, or an unpublished
  run whose due_at passed (the poll's relay sweep publishes it). A job due only in
  the window's far half (`FAR_SHARE`) is claimed by a poll sent at most that often
  (its half of the window, in seconds): under a steady load a poll then claims a
  half-window's runs, not one interval's, and each poll's fixed costs (its task,
  claim, publish and relay sweep) are spread over that many more runs. A shard not
  polled that long (a burst's first rows) is polled at once;
- a sweep: a lease that passed (the janitor), a finished run older than
  PUNCTUAL_HISTORY_DAYS (retention), or its turn among idle shards' sweeps (one
  every 10 s, so that beat still sends a task that often).

A write that makes a row due is seen by the next read, so a job created for "now"
is claimed as soon as with a poll sent every interval. A shard whose work is
unknown (the read failed, or a move fences the shard) gets every tick, as if there
were no gate: a registry that does not answer costs polls, never a run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from app.pollers.retention import history_cutoff
from app.pollers.watch import ShardWork
from app.settings import Settings

log = logging.getLogger("punctual.beat")

# The read sees every kind of work a sweep does, so an idle shard's sweep is only a
# safety net, and beat's sign of life: the idle sweeps take turns, one every
# MAX_QUIET_S, so the broker takes a task from beat that often and the alive file
# (PUNCTUAL_BEAT_ALIVE_FILE) tells a beat that cannot send from one with nothing to
# send. A shard's turn comes at least every IDLE_SWEEP_S, however many shards.
MAX_QUIET_S = 10.0
IDLE_SWEEP_S = 600.0


def idle_sweep_s(shards: int) -> float:
    """How long an idle shard goes without a sweep: a turn each, MAX_QUIET_S apart."""
    return min(IDLE_SWEEP_S, MAX_QUIET_S * shards)


# The far part of the claim-ahead window, as a share of it: a job due that far ahead
# and no nearer is claimed by a poll sent at most every FAR_SHARE x claim_ahead_s.
FAR_SHARE = 0.5


def wants_poll(
    work: ShardWork | None, now: datetime, claim_ahead_s: float, since_poll_s: float = float("inf")
) -> bool:
    """Whether a poll of a shard whose work is `work` (None: unknown) claims or
    publishes and is due: `since_poll_s` after the shard's last poll was sent, a job
    in the window's far part waits for a poll until FAR_SHARE x claim_ahead_s passed
    or it comes nearer (module doc)."""
    if work is None:
        return True
    if work.outbox_due is not None and work.outbox_due <= now:
        return True
    if work.job_due is None:
        return False
    far_s = FAR_SHARE * claim_ahead_s
    if work.job_due <= now + timedelta(seconds=claim_ahead_s - far_s):
        return True
    return work.job_due <= now + timedelta(seconds=claim_ahead_s) and since_poll_s >= far_s


def wants_sweep(
    work: ShardWork | None,
    now: datetime,
    since_last_s: float,
    history_days: float,
    idle_s: float = IDLE_SWEEP_S,
) -> bool:
    """Whether a sweep of a shard is sent, `since_last_s` after its last one."""
    if work is None or since_last_s >= idle_s:
        return True
    if work.lease_ends is not None and work.lease_ends <= now:
        return True
    return work.finished is not None and work.finished < history_cutoff(now, history_days)


Reader = Callable[[], Mapping[int, ShardWork | None]]


class Gate:
    """What beat knows of each shard's work, read at most once per poll interval."""

    def __init__(self, settings: Settings, read: Reader, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._read = read
        self._clock = clock
        self._work: Mapping[int, ShardWork | None] = {}
        self._read_at: float | None = None
        self._swept_at: dict[int, float] = {}
        self._polled_at: dict[int, float] = {}  # when each shard's last poll was sent
        self._failing = False

    def _current(self, fresh: bool = True) -> Mapping[int, ShardWork | None]:
        """The last read, read again first when it is older than half an interval (the
        polls of one round, due together, share a read) and `fresh` asks for it; a
        sweep (`fresh` false) takes the last read: its work is not urgent."""
        now = self._clock()
        stale = self._read_at is None or now - self._read_at >= self.settings.poll_interval_s / 2
        if stale and (fresh or self._read_at is None):
            self._read_at = now
            try:
                self._work = self._read()
                if self._failing:
                    log.info("beat: the registry answers again; sending polls to shards with work only")
                self._failing = False
            except Exception:  # unknown work: every tick is sent, as without a gate
                if not self._failing:
                    log.warning("beat: cannot read what is due; sending every tick meanwhile", exc_info=True)
                self._failing = True
                self._work = {}
        return self._work

    def poll(self, shard: int, now: datetime) -> bool:
        clock = self._clock()
        since = clock - self._polled_at.get(shard, -math.inf)
        if wants_poll(self._current().get(shard), now, self.settings.claim_ahead_s, since):
            self._polled_at[shard] = clock
            return True
        return False

    def sweep(self, shard: int, now: datetime) -> bool:
        work = self._current(fresh=False).get(shard)
        idle_s = idle_sweep_s(self.settings.shards)
        if shard not in self._swept_at:  # its turn (MAX_QUIET_S)
            turn = (shard % self.settings.shards) * idle_s / self.settings.shards
            self._swept_at[shard] = self._clock() - idle_s + turn
        since = self._clock() - self._swept_at[shard]
        if wants_sweep(work, now, since, self.settings.history_days, idle_s):
            self._swept_at[shard] = self._clock()
            return True
        return False
