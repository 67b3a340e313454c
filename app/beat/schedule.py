"""The beat schedule: what beat sends, where and how often (pure functions of Settings).

Every PUNCTUAL_POLL_INTERVAL_S beat sends one `punctual.poll` per logical shard to
that shard's queue; a slower `punctual.sweep` per shard runs the janitor and the
relay's full sweep. There is no beat lock: two beats only send twice the polls,
and the claim (FOR UPDATE SKIP LOCKED plus the state transition) is the guard.
"""

from __future__ import annotations

from datetime import timedelta

from app.registry.sharding import queue_name
from app.settings import Settings
from app.tasks.routing import POLL_TASK, SWEEP_TASK


def sweep_interval_s(settings: Settings) -> float:
    """How often the janitor looks for expired leases: a third of a lease, 1-15 s.

    A lease is only found expired after it passed, so a sweep every lease/3 takes a
    dead worker's runs back within ~1.33 leases; more often would only cost queries.
    """
    return max(settings.poll_interval_s, min(15.0, max(1.0, settings.lease_s / 3)))


def poll_expiry_s(settings: Settings) -> float:
    """A poll message older than this is dropped: a later tick does the same work."""
    return max(2.0, settings.poll_interval_s * 5)


def beat_schedule(settings: Settings) -> dict[str, dict]:
    schedule: dict[str, dict] = {}
    poll_every = timedelta(seconds=settings.poll_interval_s)
    sweep_every = timedelta(seconds=sweep_interval_s(settings))
    for shard in range(settings.shards):
        queue = queue_name(shard)
        schedule[f"poll-{queue}"] = {
            "task": POLL_TASK,
            "schedule": poll_every,
            "kwargs": {"shard": shard},
            "options": {"queue": queue, "expires": poll_expiry_s(settings)},
        }
        schedule[f"sweep-{queue}"] = {
            "task": SWEEP_TASK,
            "schedule": sweep_every,
            "kwargs": {"shard": shard},
            "options": {"queue": queue, "expires": sweep_interval_s(settings) * 3},
        }
    return schedule
