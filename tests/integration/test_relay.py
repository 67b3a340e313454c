"""The relay on real Postgres and RabbitMQ: batched messages, the outbox sweep."""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import timedelta

import pytest
from celery import Celery
from kombu import Connection

from app.core.timefmt import parse_instant, utcnow
from app.lifecycle.message import START_LEAD, DispatchRun, decode_runs, encode_runs
from app.pollers import relay
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.tasks.batch_publisher import BatchPublisher
from app.tasks.routing import DISPATCH_TASK, route_task, shard_queues
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


@pytest.fixture
def broker(amqp_url, pg_settings):
    """A Celery app routed like celeryconfig, and a reader of the shard queues."""
    from kombu import Exchange, Queue

    app = Celery("relay-test", set_as_current=False)
    app.conf.update(
        broker_url=amqp_url,
        task_serializer="json",
        accept_content=["json"],
        task_routes=(route_task,),
        broker_transport_options={"confirm_publish": True},
        task_queues=[Queue(q, Exchange(q, type="direct"), routing_key=q) for q in shard_queues(pg_settings)],
    )

    # The worker's way: a batch's messages published together, their confirms awaited once.
    publisher = BatchPublisher(app)

    def send(shard: int, messages: list) -> None:
        publisher.publish(
            [
                functools.partial(
                    app.send_task,
                    DISPATCH_TASK,
                    kwargs={"shard": shard, "runs": encode_runs(entries)},
                    eta=eta,
                    retry=False,
                )
                for eta, entries in messages
            ]
        )

    def drain(queue: str) -> list[dict]:
        bodies = []
        with Connection(amqp_url) as conn:
            simple = conn.SimpleQueue(queue, queue_opts={"durable": True}, exchange_opts={"type": "direct"})
            simple.queue.routing_key = queue
            while True:
                try:
                    message = simple.get(timeout=1)
                except simple.Empty:
                    break
                assert message.content_type == "application/json"
                assert message.headers["task"] == DISPATCH_TASK
                kwargs = json.loads(message.body)[1]  # [args, kwargs, embed]
                assert isinstance(kwargs["runs"], str)  # one JSON text (app.lifecycle.message)
                bodies.append(
                    {**kwargs, "runs": decode_runs(kwargs["runs"]), "eta": message.headers.get("eta")}
                )
                message.ack()
            simple.close()
        return bodies

    with app.connection_for_write() as conn:  # declare the queues
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()
    yield send, drain
    publisher.close()
    app.close()


def test_a_claim_batch_becomes_a_few_messages_on_its_shard_queue(registry, broker):
    send, drain = broker
    rows = [job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=6) for _ in range(250)]
    insert_jobs(registry, rows)
    engine = registry.engine_for_shard(6)
    claimed = claim_batch(engine, 6, utcnow(), registry.settings, send=send).runs
    messages = drain("shard-06")
    assert sorted(len(m["runs"]) for m in messages) == [83, 83, 84] and {m["shard"] for m in messages} == {6}
    assert {m["eta"] for m in messages} == {None}  # due already: to be run at once
    entries = [DispatchRun.from_message(e) for m in messages for e in m["runs"]]
    assert {e.run_id for e in entries} == {r.run_id for r in claimed}
    assert entries[0].payload == {"job": str(entries[0].job_id)} and entries[0].target["type"] == "webhook"
    # Published before the claim committed: no outbox row, no mark.
    assert all(runs_of(registry, r["job_id"]) == [] for r in rows[:10])
    assert drain("shard-07") == []


def test_a_claim_whose_publish_fails_claims_nothing(registry, broker):
    """Invariant 8 without an outbox: the claim commits only once its messages are on
    the broker; messages a failed claim published start nothing (no job holds their
    tokens), and the next claim takes the job again."""
    from app.lifecycle.lease import start

    send, drain = broker
    row = job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=9)
    insert_jobs(registry, [row])
    engine = registry.engine_for_shard(9)

    def send_then_die(shard, messages):
        send(shard, messages)
        raise ConnectionError("the poller dies before its COMMIT")

    with pytest.raises(ConnectionError):
        claim_batch(engine, 9, utcnow(), registry.settings, send=send_then_die)
    assert job(registry, row["job_id"])["state"] == "scheduled"
    [stale] = [DispatchRun.from_message(e) for m in drain("shard-09") for e in m["runs"]]
    assert start(registry, [stale], utcnow()) == set()
    [run] = claim_batch(engine, 9, utcnow(), registry.settings, send=send).runs
    [message] = drain("shard-09")
    assert [e["run_id"] for e in message["runs"]] == [str(run.run_id)]
    assert job(registry, row["job_id"])["lease_token"] == run.lease_token
    assert start(registry, [run], utcnow()) == {run.run_id}
    assert runs_of(registry, row["job_id"])[0]["state"] == "running"


def test_triggered_runs_are_swept_at_once(registry, broker):
    from app.services.jobs import trigger_job

    send, drain = broker
    row = job_row(16, run_at=utcnow() + timedelta(hours=1), shard=10)
    insert_jobs(registry, [row])
    now = utcnow()
    trigger_job(registry, "tests", str(row["job_id"]), now)
    assert relay.sweep(registry.engine_for_shard(10), 10, now, send) == 1
    [message] = drain("shard-10")
    [entry] = message["runs"]
    assert entry["origin"] == "trigger" and entry["attempt"] == 1


def test_one_poll_tick_drains_a_burst_and_sweeps(registry, broker):
    """A poll keeps claiming while batches come back full (within the budget), then sweeps."""
    from app.services.jobs import trigger_job
    from app.tasks.shard import poll_shard

    send, drain = broker
    now = utcnow()
    rows = [job_row(16, run_at=now - timedelta(seconds=1), shard=12) for _ in range(1200)]
    later = job_row(16, run_at=now + timedelta(hours=1), shard=12)
    insert_jobs(registry, rows + [later])
    trigger_job(registry, "tests", str(later["job_id"]), now)
    report = poll_shard(registry.settings, registry.engine_for_shard(12), 12, send)
    assert report == {"shard": 12, "claimed": 1200, "batches": 3, "swept": 1}
    entries = [e for m in drain("shard-12") for e in m["runs"]]
    assert len(entries) == 1201 and len({e["run_id"] for e in entries}) == 1201


def test_a_run_claimed_ahead_travels_in_a_message_that_runs_just_before_its_instant(registry, broker):
    """The eta is the instant less START_LEAD: the worker starts the run then and holds
    its call on a timer until the instant itself (app.worker.engine)."""
    send, drain = broker
    fire = (utcnow() + timedelta(seconds=4)).replace(microsecond=250_000)
    engine, run = _claim_one(registry, 5, fire, utcnow(), registry.settings)
    assert run.fire_at == fire
    relay.publish_claimed(engine, 5, [run], send)
    [message] = drain("shard-05")
    assert parse_instant(message["eta"]) == fire - START_LEAD
    assert parse_instant(message["runs"][0]["fire_at"]) == fire


def test_a_start_that_comes_before_the_claims_commit_waits_for_it(registry):
    """The claim publishes before its COMMIT, so a worker may start a run whose job's
    lease is not committed yet: the start waits on the job row's lock and then starts
    it (compared before the lock, the token would read as before the claim: stale)."""
    import threading
    import time

    from app.lifecycle.lease import start

    row = job_row(16, run_at=utcnow() - timedelta(seconds=1), shard=8)
    insert_jobs(registry, [row])
    started: list = []
    workers: list[threading.Thread] = []

    def send_and_start(shard, messages):
        runs = [DispatchRun.from_message(e) for _, entries in messages for e in entries]
        worker = threading.Thread(target=lambda: started.append(start(registry, runs, utcnow())))
        worker.start()
        workers.append(worker)
        time.sleep(0.5)  # the start reaches the job row the claim holds, and waits
        assert not started, "the start did not wait for the claim's COMMIT"

    engine = registry.engine_for_shard(8)
    [run] = claim_batch(engine, 8, utcnow(), registry.settings, send=send_and_start).runs
    workers[0].join(10)
    assert started == [{run.run_id}]
    assert [r["state"] for r in runs_of(registry, row["job_id"])] == ["running"]


def test_a_claim_ahead_publishes_its_run_with_its_instant(registry, broker):
    send, drain = broker
    fire = (utcnow() + timedelta(seconds=30)).replace(microsecond=0)
    settings = dataclasses.replace(registry.settings, claim_ahead_s=60)
    insert_jobs(registry, [job_row(16, run_at=fire, shard=4)])
    [run] = claim_batch(registry.engine_for_shard(4), 4, utcnow(), settings, send=send).runs
    [message] = drain("shard-04")
    assert parse_instant(message["eta"]) == fire - START_LEAD
    assert DispatchRun.from_message(message["runs"][0]) == run


def _claim_one(registry, shard: int, fire, now, settings):
    """A one-off due at `fire` on `shard`, claimed at `now`: its engine and its run."""
    insert_jobs(registry, [job_row(16, run_at=fire, shard=shard)])
    engine = registry.engine_for_shard(shard)
    [run] = claim_batch(engine, shard, now, settings).runs
    return engine, run
