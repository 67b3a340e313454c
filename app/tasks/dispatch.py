"""The dispatch task: one Celery message, a batch of runs, for one shard's queue.

The task only parses the batch and hands it to this process's Dispatcher
(app.worker.engine), which starts the runs (fenced) and calls their targets on
its own threads; the task returns once the runs are started, and the message is
acknowledged then (acks_late, see celeryconfig). No autoretry: the target call is
never retried here (retries live in the registry).

When the registry (or Redis) stays unreachable beyond the retry budget of the start
or of a process's first read of the shard map (app.registry.transient), or a shard
move's fence outlasts the start's wait for it (app.lifecycle.lease), the task
rejects its message with requeue: the broker hands it out again at once, to this
worker or another, and the fenced start skips what was started already. Its runs
do not wait for a lease. Any other failure is a bug, and the message is
acknowledged (a poison message must not loop); its runs come back through the
lease and the janitor.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime

from celery import shared_task
from celery.exceptions import Reject
from celery.utils.log import get_task_logger

from app.lifecycle.message import DispatchRun, decode_runs, encode_runs, message_headers
from app.logs import log_context
from app.registry.engines import is_fence_error
from app.registry.sharding import queue_name
from app.registry.transient import is_transient
from app.tasks.batch_publisher import BatchPublisher
from app.tasks.routing import DISPATCH_TASK
from app.worker.context import get_context

log = get_task_logger("punctual.dispatch")


@shared_task(name=DISPATCH_TASK, acks_late=True, ignore_result=True, max_retries=0)
def dispatch(shard: int, runs: str | list[dict]) -> dict:
    batch = [DispatchRun.from_message(entry) for entry in decode_runs(runs)]
    with log_context(shard=shard):
        try:
            report = get_context().dispatcher.dispatch(batch)
        except Exception as exc:
            if not (is_transient(exc) or is_fence_error(exc)):
                raise
            log.warning(
                "dispatch of %d runs on shard %d gave its message back: %s",
                len(batch),
                shard,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            raise Reject(exc, requeue=True) from exc
    return {"shard": shard, "started": report.started, "held": report.held, "stale": report.stale}


def send_dispatch(shard: int, entries: list[dict], eta: datetime | None = None, producer=None) -> None:
    """One dispatch message to the shard's queue (confirmed by the broker). With an
    `eta` (runs claimed ahead) the worker that receives it keeps it, unacknowledged,
    and runs it at that instant; if that worker dies the broker hands the message to
    another, which does the same. With a `producer` (BatchPublisher's) the message is
    sent once, unconfirmed here: the batch waits for its confirms."""
    dispatch.apply_async(
        kwargs={"shard": shard, "runs": encode_runs(entries)},
        eta=eta,
        shadow=shown_name(shard, len(entries)),
        # Read by the worker's turnstile (app.tasks.turnstile) to take turns without the body.
        headers=message_headers(entries),
        **({"producer": producer, "retry": False} if producer is not None else {}),
    )


_publisher: BatchPublisher | None = None


def send_dispatches(shard: int, messages: Sequence[tuple[datetime | None, list[dict]]]) -> None:
    """The relay's `send`: a batch's dispatch messages. On RabbitMQ they are published
    together and their confirms awaited once (app.tasks.batch_publisher); on the
    embedded broker of `punctual dev`, which has no confirms, one by one."""
    global _publisher
    if not dispatch.app.conf.broker_transport_options.get("confirm_publish"):
        for eta, entries in messages:
            send_dispatch(shard, entries, eta)
        return
    if _publisher is None:
        _publisher = BatchPublisher(dispatch.app)
    _publisher.publish([functools.partial(send_dispatch, shard, entries, eta) for eta, entries in messages])


def shown_name(shard: int, runs: int) -> str:
    """The name Flower and the worker's log show for one dispatch message: what it carries
    (`punctual.dispatch shard-07 x100`). Celery's `shadow` changes only the name shown;
    routing and the task that runs go by the real name."""
    return f"{DISPATCH_TASK} {queue_name(shard)} x{runs}"
