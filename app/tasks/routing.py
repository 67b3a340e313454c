"""The Celery task names, and the queue each task goes to (pure).

The names are the contract between beat (app.beat.schedule), the tasks that bear
them (app.tasks.shard, app.tasks.dispatch), the worker's turnstile that tells them
apart, and the router. Every task of a logical shard goes to that shard's queue
(`shard-NN`), so a shard's work runs wherever its queue is consumed.
"""

from __future__ import annotations

from app.registry.sharding import queue_name
from app.settings import Settings

POLL_TASK = "punctual.poll"
SWEEP_TASK = "punctual.sweep"
DISPATCH_TASK = "punctual.dispatch"


def route_task(name: str, args, kwargs, options, task=None, **_kw) -> dict | None:
    """Celery task router: every Punctual task goes to the queue of its `shard` kwarg."""
    if name in (POLL_TASK, SWEEP_TASK, DISPATCH_TASK) and kwargs and "shard" in kwargs:
        return {"queue": queue_name(int(kwargs["shard"]))}
    return None


def shard_queues(settings: Settings) -> list[str]:
    return [queue_name(shard) for shard in range(settings.shards)]
