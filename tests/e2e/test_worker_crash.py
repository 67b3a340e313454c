"""Invariant 1 end to end: a worker SIGKILLed in the middle of a slow call. After
the lease the run is started again, by another worker, with the same key; the
killed worker's late completion (its stale token) changes nothing. And a worker
SIGKILLed while it holds a run claimed ahead: the broker hands the message on."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from app import metrics
from app.core.retries import CallOutcome
from app.core.timefmt import format_instant, utcnow
from app.lifecycle.completion import Finished, complete
from app.lifecycle.message import DispatchRun
from app.registry.engines import registry_for
from app.registry.sharding import shard_for
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.rows import job as job_of
from tests.rows import runs_of
from tests.sink import Answer

pytestmark = pytest.mark.e2e


def test_a_killed_workers_run_is_started_again_after_the_lease(stack_env, settings, logs, sink, api):
    sink.script("/slow", [Answer(200, delay_s=-1), Answer(200)])  # the first call hangs
    first = start_worker(stack_env, logs, name="doomed")
    beat = start_beat(stack_env, logs)
    second = None
    try:
        wait_ready(first, 1.0)
        job = api.create(
            target={"type": "webhook", "url": sink.url("/slow")},
            schedule={"run_at": format_instant(utcnow())},
        )
        [hung] = sink.wait_for(1, "/slow", timeout_s=10)
        killed_at = utcnow()
        first.kill()
        second = start_worker(stack_env, logs, name="survivor")
        calls = sink.wait_for(2, "/slow", timeout_s=30)
        again = calls[1]
        assert again.header("Idempotency-Key") == hung.header("Idempotency-Key")
        assert (hung.header("Punctual-Attempt"), again.header("Punctual-Attempt")) == ("1", "2")
        # Not before the lease (3 s from the claim, extended by heartbeats until the kill) ran out.
        assert again.at >= killed_at.timestamp() + 0.5
        history = api.wait_runs(job["id"], lambda h: len(h) == 2 and h[-1]["state"] == "succeeded")
        assert history[0]["state"] == "failed" and history[0]["error"].startswith("lease expired")
        done = api.job(job["id"])
        assert done["state"] == "completed"

        # The killed worker comes back from the dead with its old token: nothing changes.
        registry = registry_for(settings)
        old = runs_of(registry, uuid.UUID(job["id"]))[0]
        stale = DispatchRun.from_row(old, None)
        before = metrics.STALE_COMPLETIONS._value.get()
        report = complete(registry, [Finished(stale, CallOutcome(status_code=200), utcnow())], utcnow())
        assert report.stale == 1 and metrics.STALE_COMPLETIONS._value.get() == before + 1
        assert api.job(job["id"]) == done and api.runs(job["id"]) == history
    finally:
        sink.release.set()
        beat.stop()
        for proc in (first, second):
            if proc is not None:
                proc.stop()


def test_a_worker_killed_while_it_holds_a_run_claimed_ahead_loses_nothing(
    stack_env, settings, logs, sink, api
):
    """The message of a run claimed ahead waits, unacknowledged, in the worker until
    its instant; killed then, the worker gives it back to the broker, and the next
    worker calls at the instant, on the first attempt (no lease had to expire)."""
    holder = start_worker(stack_env, logs, name="holder")
    beat = start_beat(stack_env, logs)
    heir = None
    try:
        wait_ready(holder, 1.0)
        due = (utcnow() + timedelta(seconds=9)).replace(microsecond=0)
        job = api.create(
            target={"type": "webhook", "url": sink.url("/held")}, schedule={"run_at": format_instant(due)}
        )
        registry = registry_for(settings)
        queue = f"shard-{shard_for(job['id'], settings.shards):02d}"
        # Claimed ahead (within a poll interval; the claim commits once its message is
        # published) and taken off the queue by the holder, which keeps it
        # unacknowledged until the instant.
        while not (
            job_of(registry, uuid.UUID(job["id"]))["lease_token"] is not None
            and _ready_messages(stack_env["PUNCTUAL_BROKER_URL"], queue) == 0
        ):
            assert utcnow() < due - timedelta(seconds=4), "not claimed ahead and held"
            time.sleep(0.1)
        holder.kill()
        assert sink.calls("/held") == []
        heir = start_worker(stack_env, logs, name="heir")
        [call] = sink.wait_for(1, "/held", timeout_s=30)
        assert call.at >= due.timestamp() and call.header("Punctual-Attempt") == "1"
        [run] = api.wait_runs(job["id"], lambda h: h and h[-1]["state"] == "succeeded")
        assert run["attempt"] == 1
    finally:
        beat.stop()
        for proc in (holder, heir):
            if proc is not None:
                proc.stop()


def _ready_messages(broker_url: str, queue: str) -> int:
    """Messages waiting in `queue` (not those a consumer holds unacknowledged)."""
    from kombu import Connection

    with Connection(broker_url) as conn:
        return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
