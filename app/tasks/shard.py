"""The beat-driven tasks of a shard: `punctual.poll` and `punctual.sweep`.

poll (every PUNCTUAL_POLL_INTERVAL_S): claim due jobs batch after batch while the
batches come back full, within PUNCTUAL_POLL_BUDGET_S, publishing each batch right
before its COMMIT (app.pollers.claim), so one tick drains a burst; then the relay sweep publishes
outbox rows that are due (triggered and replayed runs, off-schedule retries, runs a
crashed poller left unpublished), so those wait at most about one poll interval.

sweep (slower, see app.beat.schedule): the janitor takes back expired leases, the
relay sweep runs once more, and retention deletes history older than
PUNCTUAL_HISTORY_DAYS (app.pollers.retention).

While a move fences the shard (app.registry.mover) both do nothing: the map says
so, and a tick that started before the map did is refused by the database's fence
(SQLSTATE PT409) and ends quietly; the next tick after the switch claims on the
shard's new database.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Protocol

import sqlalchemy as sa
from celery import shared_task

from app import metrics
from app.core.timefmt import utcnow
from app.logs import log_context
from app.pollers import janitor, relay, retention
from app.pollers.claim import claim_batch
from app.registry.engines import is_fence_error
from app.registry.transient import first_line, is_transient, retrying
from app.services.owners import ClaimView
from app.settings import Settings
from app.tasks.routing import POLL_TASK, SWEEP_TASK
from app.worker.context import get_context

log = logging.getLogger("punctual.poll")


def poll_shard(settings: Settings, engine, shard: int, send, owners: OwnerView | None = None) -> dict:
    """One poll tick of one shard; returns what it did (for logs and tests). `owners`:
    the weights that are not 1 (the claim is fair between owners by weight) and the
    paused owners (none of their runs is claimed or published), asked before each
    batch (cached), so a pause reaches a poll that is draining a burst."""
    deadline = time.monotonic() + settings.poll_budget_s
    claimed = batches = 0
    while True:
        # A claim that met a dropped connection is sent again (a new `now` each time);
        # past the poll budget the tick gives up and the next one claims.
        result = retrying(
            functools.partial(_claim_now, engine, shard, settings, _view(owners), send),
            f"claim on shard {shard}",
            budget_s=max(1.0, settings.poll_budget_s),
        )
        claimed += len(result.runs)
        batches += 1
        if not result.full or time.monotonic() >= deadline:
            break
    swept = relay.sweep(engine, shard, utcnow(), send, held=_view(owners).paused)
    return {"shard": shard, "claimed": claimed, "batches": batches, "swept": swept}


def _claim_now(engine, shard: int, settings: Settings, view: ClaimView, send):
    return claim_batch(engine, shard, utcnow(), settings, weights=view.weights, paused=view.paused, send=send)


def sweep_shard(settings: Settings, engine, shard: int, send, owners: OwnerView | None = None) -> dict:
    """One sweep of one shard: expired leases, the outbox, then old history (the
    paused owners' runs that wait to start are left as they are)."""
    held = _view(owners).paused
    expired = janitor.expire(engine, shard, utcnow(), settings, held=held)
    swept = relay.sweep(engine, shard, utcnow(), send, held=held)
    pruned = retention.prune(engine, shard, utcnow(), settings.history_days)
    return {"shard": shard, "expired": expired, "swept": swept, "pruned": pruned}


def _unless_fenced(registry, shard: int, tick):
    """Run `tick` on the shard's database unless a move fences the shard. A transient
    failure that outlasted the tick's own retries (or met this process's first read
    of the shard map with no database answering) ends the tick with one warning line
    and `unreachable` in its report: the next tick tries again."""
    try:
        if registry.shard_fenced(shard):
            return {"shard": shard, "fenced": True}
        with log_context(shard=shard):
            return tick(registry.engine_for_shard(shard))
    except Exception as exc:
        if isinstance(exc, sa.exc.DBAPIError) and is_fence_error(exc):
            return {"shard": shard, "fenced": True}
        if not is_transient(exc):
            raise
        log.warning(
            "shard %d: the tick gave up (%s: %s); the next tick tries again",
            shard,
            type(exc).__name__,
            first_line(exc),
        )
        return {"shard": shard, "unreachable": True}


# send_events=False: no task events (received, started, succeeded) for the ticks, so
# Flower's Tasks page shows the dispatches rather than thousands of polls an hour.
# Celery checks this per task, in the worker, even while Flower has events switched on.
@shared_task(name=POLL_TASK, acks_late=False, ignore_result=True, max_retries=0, send_events=False)
def poll(shard: int) -> dict:
    # acks_late off: a poll lost with its worker is replaced by the next tick.
    from app.tasks.dispatch import send_dispatches

    context = get_context()
    with log_context(shard=shard):
        done = _unless_fenced(
            context.registry,
            shard,
            lambda engine: poll_shard(context.settings, engine, shard, send_dispatches, context.owners),
        )
    # Counted once the tick ended (a fenced shard's too: it is served, by its move), not
    # when it gave up: a shard whose count stops rising has no worker on its queue, no
    # beat, or a failing claim.
    if not done.get("unreachable"):
        metrics.POLLS.labels(str(shard)).inc()
    return done


class OwnerView(Protocol):
    def claim_view(self) -> ClaimView: ...


_NO_VIEW = ClaimView({}, frozenset())
# The last view read, kept while the home DSN does not answer: a pause must hold then too.
_last_view: ClaimView = _NO_VIEW


def _view(owners: OwnerView | None) -> ClaimView:
    global _last_view
    if owners is None:
        return _NO_VIEW
    try:
        _last_view = owners.claim_view()
    except Exception:  # the home DSN down must not stop a shard's claim: the last view meanwhile
        log.warning("owner weights and switches unavailable; claiming with the last known", exc_info=True)
    return _last_view


@shared_task(name=SWEEP_TASK, acks_late=False, ignore_result=True, max_retries=0, send_events=False)
def sweep(shard: int) -> dict:
    from app.tasks.dispatch import send_dispatches

    context = get_context()
    return _unless_fenced(
        context.registry,
        shard,
        lambda engine: sweep_shard(context.settings, engine, shard, send_dispatches, context.owners),
    )
