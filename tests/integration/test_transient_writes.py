"""The worker's writes on real Postgres when a connection breaks, and the lease check
before a call (app.lifecycle.lease, app.worker.engine, app.registry.transient)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
import sqlalchemy.exc as sa_exc

from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.pollers.claim import claim_batch
from app.registry.engines import Registry, registry_for
from app.registry.schema import jobs, runs
from app.registry.sharding import shard_for
from app.services.owners import create_key
from app.worker.context import WorkerContext
from app.worker.engine import _Call
from tests.rows import insert_jobs, job, job_row, runs_of, webhook_target

pytestmark = pytest.mark.integration


class _LosesCommitAnswers:
    """An engine whose first `lost` transactions commit, and then raise as if the
    connection broke before the COMMIT's answer came back (the ambiguous case)."""

    def __init__(self, engine, lost: int = 1):
        self.engine = engine
        self.lost = lost

    @contextlib.contextmanager
    def begin(self):
        with self.engine.begin() as conn:
            yield conn
        if self.lost:
            self.lost -= 1
            raise sa_exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    settings = dataclasses.replace(pg_settings, lease_s=20.0, heartbeat_s=5.0)
    registry = registry_for(settings)
    create_key(registry, "tests")
    return registry


def claimed(registry, count: int, url: str = "http://127.0.0.1:9/") -> list:
    due = utcnow() - timedelta(seconds=1)
    rows = [job_row(16, run_at=due, target=webhook_target(url)) for _ in range(count)]
    insert_jobs(registry, rows)
    found = []
    for shard in sorted({r["shard"] for r in rows}):
        found += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    return found


def flaky(registry, lost: int = 1) -> Registry:
    proxy = Registry(registry.settings)
    proxy.__dict__["engines"] = tuple(_LosesCommitAnswers(engine, lost) for engine in registry.engines)
    return proxy


def test_a_start_whose_commit_answer_was_lost_recognises_the_runs_it_started(registry):
    runs = claimed(registry, 12)
    started = lease.start(flaky(registry), runs, utcnow())
    # The first try committed; the retry finds them `running` with this start's instant.
    assert started == {run.run_id for run in runs}
    assert all(runs_of(registry, run.job_id)[0]["state"] == "running" for run in runs)


def test_a_second_start_of_the_same_runs_starts_nothing(registry):
    runs = claimed(registry, 3)
    assert lease.start(registry, runs, utcnow()) == {run.run_id for run in runs}
    # Another worker's start (a redelivered message) has another instant: nothing is its own.
    assert lease.start(flaky(registry), runs, utcnow()) == set()


def test_hold_and_heartbeat_go_through_a_lost_commit_answer(registry):
    runs = claimed(registry, 4)
    started, held = runs[:2], runs[2:]
    lease.start(registry, started, utcnow())
    assert lease.heartbeat(flaky(registry), started, utcnow()) == {run.run_id for run in started}
    later = utcnow() + timedelta(seconds=30)
    lease.hold(flaky(registry), [(run, later) for run in held], utcnow())  # its count is lost with the answer
    for run in held:
        assert runs_of(registry, run.job_id) == [] and job(registry, run.job_id)["state"] == "scheduled"


def test_a_heartbeat_reports_the_leases_it_no_longer_holds(registry):
    runs = claimed(registry, 3)
    lease.start(registry, runs, utcnow())
    taken_back = runs[0]
    _take_back(registry, taken_back.job_id)
    assert lease.heartbeat(registry, runs, utcnow()) == {run.run_id for run in runs[1:]}


def _take_back(registry, job_id: uuid.UUID) -> None:
    """What the janitor does to an expired lease, as far as the worker can tell: the token
    is gone from the job, and the started run is settled."""
    engine = registry.engine_for_shard(shard_for(job_id, registry.settings.shards))
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs).where(jobs.c.job_id == job_id).values(lease_token=None, leased_until=None)
        )
        conn.execute(sa.update(runs).where(runs.c.job_id == job_id).values(state="failed", leased_until=None))


def test_a_run_whose_lease_may_have_run_out_is_called_only_if_a_renewal_finds_it_held(registry):
    context = WorkerContext(registry.settings)
    try:
        dispatcher = context.dispatcher
        runs = claimed(registry, 2)
        lease.start(registry, runs, utcnow())
        kept, lost = (_Call(run, (), frozenset()) for run in runs)
        # Both waited past their lease (as in a stopped process); one was taken back meanwhile.
        kept.lease_until = lost.lease_until = time.monotonic() - 1
        _take_back(registry, lost.run.job_id)
        assert dispatcher._still_leased(kept) and kept.lease_until > time.monotonic() + 10
        assert not dispatcher._still_leased(lost)
        # A heartbeat that found the token gone settles it without a round trip.
        fresh = _Call(runs[0], (), frozenset(), lease_until=time.monotonic() + 20, lost=True)
        assert not dispatcher._still_leased(fresh)
    finally:
        context.close(2)


def test_a_call_withdrawn_as_it_is_about_to_go_out_sends_nothing():
    from app.worker.webhook import NotSent, WebhookCall, WebhookCaller
    from tests.sink import Sink

    sink, caller = Sink(), WebhookCaller(allow_private=True)
    try:

        def call(may_send, method="POST"):
            target = {**webhook_target(sink.url("/w")), "method": method}
            return caller.call(WebhookCall("j", utcnow(), 1, target, {"n": 1}, "s3cret", may_send=may_send))

        with pytest.raises(NotSent):
            call(lambda: False)
        assert call(lambda: True).status_code == 200
        assert len(sink.calls("/w")) == 1

        # The process stalled after the first look (its lease ran out meanwhile): the
        # look again as the request is about to be written (headers and body in one
        # write) withdraws it, on a pooled connection and on a new one alike, with a
        # body or without; the target gets nothing, not even the headers.
        for method in ("POST", "GET"):
            for fresh in (False, True):
                if fresh:
                    caller.close()
                looks = iter([True, False])
                with pytest.raises(NotSent):
                    call(lambda looks=looks: next(looks), method)
        assert len(sink.calls("/w")) == 1
        assert call(lambda: True).status_code == 200  # nothing left over for the next call
    finally:
        caller.close()
        sink.close()


def test_a_withdrawn_call_gives_its_slot_back_once_and_records_nothing(registry, caplog):
    from app.worker.webhook import NotSent

    class Withdrawn:
        async def send(self, call):
            raise NotSent("withdrawn")

        def close(self):
            pass

    context = WorkerContext(registry.settings)
    try:
        dispatcher = context.dispatcher
        dispatcher.webhooks = Withdrawn()
        runs = claimed(registry, 3)
        with caplog.at_level("WARNING", logger="punctual.dispatch"):
            assert dispatcher.dispatch(runs).started == 3
            deadline = time.monotonic() + 10
            while (dispatcher.in_flight() or dispatcher._slots._value < dispatcher.capacity) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.05)
        assert dispatcher.in_flight() == 0 and dispatcher._slots._value == dispatcher.capacity
        # Each slot went back once: a second release of the BoundedSemaphore would have
        # raised in the call's task, which logs it.
        assert not [r for r in caplog.records if "a call task failed" in r.getMessage()]
        assert len([r for r in caplog.records if "not called" in r.getMessage()]) == 3
        assert all(runs_of(registry, run.job_id)[0]["state"] == "running" for run in runs)
    finally:
        context.close(2)
