"""QueuePublisher against a real RabbitMQ vhost."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from kombu import Connection, Queue

from app.worker.queue_publisher import EXCHANGE, QueueCall, QueuePublisher
from punctual_client.signature import verify_signature

pytestmark = pytest.mark.integration

SECRET = "whsec_queue_secret"
JOB_ID = "7f0c2a1e-0000-4000-8000-000000000002"
SCHEDULED_FOR = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
TRACEPARENT = "00-5b0e4f3c2f6a4d7e9a517c1f0d3e8b21-9a517c1f0d3e8b21-01"


def make_call(topic: str, attempt: int = 1, payload=None) -> QueueCall:
    return QueueCall(
        job_id=JOB_ID,
        scheduled_for=SCHEDULED_FOR,
        attempt=attempt,
        topic=topic,
        payload={"report": "daily", "n": 1} if payload is None else payload,
        signing_secrets=(SECRET,),
        traceparent=TRACEPARENT,
    )


@pytest.fixture(scope="module")
def publisher(amqp_url):
    p = QueuePublisher(amqp_url)
    yield p
    p.close()


@pytest.fixture(scope="module")
def consumer(amqp_url):
    with Connection(amqp_url) as conn:
        yield conn


def bind(consumer, pattern: str, **arguments) -> Queue:
    """A fresh queue bound to punctual.jobs (declaring the exchange as Punctual does)."""
    queue = Queue(
        f"q-{uuid.uuid4().hex[:8]}",
        exchange=EXCHANGE,
        routing_key=pattern,
        auto_delete=False,
        queue_arguments=arguments or None,
    )
    queue(consumer.default_channel).declare()
    return queue


def drain(consumer, queue: Queue, expect: int, ceiling_s: float = 10.0) -> list:
    bound = queue(consumer.default_channel)
    messages, deadline = [], time.monotonic() + ceiling_s
    while len(messages) < expect and time.monotonic() < deadline:
        message = bound.get(no_ack=True)
        if message is None:
            time.sleep(0.02)
        else:
            messages.append(message)
    return messages


def raw(message) -> bytes:
    """The body bytes as sent (kombu decodes a body that names its content_encoding)."""
    body = message.body
    return body if isinstance(body, bytes) else body.encode(message.content_encoding)


def test_publish_delivers_the_payload_with_webhook_headers(publisher, consumer):
    queue = bind(consumer, "reports.*")
    outcome = publisher.publish(make_call("reports.daily", attempt=2))
    assert outcome.error is None and outcome.status_code is None and outcome.succeeded
    [message] = drain(consumer, queue, 1)
    assert message.delivery_info["exchange"] == "punctual.jobs"
    assert message.delivery_info["routing_key"] == "reports.daily"
    assert message.content_type == "application/json"
    assert message.properties["delivery_mode"] == 2
    assert message.content_encoding == "utf-8"
    assert json.loads(raw(message)) == {"report": "daily", "n": 1}
    assert raw(message) == b'{"report":"daily","n":1}'
    headers = message.headers
    assert headers["Idempotency-Key"] == f"{JOB_ID}:2026-12-01T00:00:00Z"
    assert headers["Punctual-Job-Id"] == JOB_ID
    assert headers["Punctual-Scheduled-For"] == "2026-12-01T00:00:00Z"
    assert headers["Punctual-Attempt"] == "2"
    assert headers["traceparent"] == TRACEPARENT  # the run's trace, as a webhook call carries it
    assert all(isinstance(v, str) for v in headers.values())
    verify_signature(SECRET, headers["Punctual-Signature"], raw(message))
    assert message.properties["message_id"] == headers["Idempotency-Key"]


def test_the_exchange_is_a_durable_topic_exchange(publisher, amqp_url):
    assert publisher.publish(make_call("anything")).succeeded
    vhost = amqp_url.rsplit("/", 1)[1]
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_exchanges", "-p", vhost, "name", "type", "durable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in listing.splitlines() if line.strip()}
    assert rows["punctual.jobs"] == ["topic", "true"]


def test_routing_follows_the_topic(publisher, consumer):
    queue = bind(consumer, "billing.#")
    assert publisher.publish(make_call("billing.eu.run", payload=1)).succeeded
    assert publisher.publish(make_call("reports.daily", payload=2)).succeeded
    assert [raw(m) for m in drain(consumer, queue, 2, ceiling_s=1)] == [b"1"]


def test_a_nacked_publish_is_an_error(publisher, consumer):
    """A full queue with overflow=reject-publish makes the broker nack."""
    topic = f"full.{uuid.uuid4().hex[:6]}"
    bind(consumer, topic, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert publisher.publish(make_call(topic)).succeeded
    nacked = publisher.publish(make_call(topic))
    assert not nacked.succeeded and nacked.status_code is None
    assert "nack" in nacked.error and nacked.retryable_error
    # The connection the nack came on was thrown away; the next publish works.
    assert publisher.publish(make_call("reports.daily")).succeeded


def test_unroutable_messages_are_confirmed(publisher):
    assert publisher.publish(make_call(f"nobody.listens.{uuid.uuid4().hex[:6]}")).succeeded


@pytest.fixture
def own_vhost():
    """A vhost of this test alone: closing its connections disturbs no other test."""
    from tests.conftest import AMQP_BASE

    vhost = f"pt_{uuid.uuid4().hex[:12]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(
        ["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
        check=True,
        capture_output=True,
    )
    yield vhost, f"{AMQP_BASE}/{vhost}"
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


def test_reconnects_after_the_broker_closes_the_connection(own_vhost):
    vhost, url = own_vhost
    publisher = QueuePublisher(url, pool_size=1)
    try:
        assert publisher.publish(make_call("after.close", payload="before")).succeeded
        subprocess.run(
            ["rabbitmqctl", "-q", "close_all_connections", "-p", vhost, "test: broken connection"],
            check=True,
            capture_output=True,
        )
        time.sleep(0.5)
        with Connection(url) as consumer:
            queue = bind(consumer, "after.close")
            # The broker said goodbye while the connection was idle: the publisher
            # notices before publishing and uses a fresh connection.
            outcome = publisher.publish(make_call("after.close", payload="after"))
            assert outcome.succeeded, outcome
            assert [raw(m) for m in drain(consumer, queue, 1)] == [b'"after"']
    finally:
        publisher.close()


def test_an_unreachable_broker_is_an_error_not_a_hang():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    publisher = QueuePublisher(f"amqp://guest:guest@127.0.0.1:{port}//", connect_timeout_s=2)
    try:
        started = time.monotonic()
        outcome = publisher.publish(make_call("reports.daily"))
        assert not outcome.succeeded and outcome.retryable_error
        assert "failed" in outcome.error
        assert time.monotonic() - started < 30
    finally:
        publisher.close()


def test_many_threads_share_one_publisher(publisher, consumer):
    queue = bind(consumer, "threads.test")
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(
            pool.map(lambda i: publisher.publish(make_call("threads.test", payload=i)), range(200))
        )
    assert all(o.succeeded for o in outcomes), [o.error for o in outcomes if not o.succeeded][:3]
    assert sorted(int(raw(m)) for m in drain(consumer, queue, 200)) == list(range(200))
