"""A relay batch's dispatch messages, published together and confirmed together (real RabbitMQ)."""

from __future__ import annotations

import functools
import select
import socket

import pytest
from amqp.exceptions import MessageNacked
from celery import Celery
from kombu import Connection, Exchange, Queue

from app.tasks.batch_publisher import BatchPublisher

pytestmark = pytest.mark.integration


@pytest.fixture
def app(amqp_url):
    app = Celery("batch-publisher-test", set_as_current=False)
    app.conf.update(
        broker_url=amqp_url,
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options={"confirm_publish": True},
    )
    yield app
    app.close()


def declare(amqp_url: str, name: str, **arguments) -> Queue:
    queue = Queue(
        name, Exchange(name, type="direct"), routing_key=name, durable=True, queue_arguments=arguments
    )
    with Connection(amqp_url) as conn:
        queue(conn.default_channel).declare()
    return queue


def waiting(amqp_url: str, name: str) -> int:
    with Connection(amqp_url) as conn:
        return conn.default_channel.queue_declare(name, passive=True).message_count


def messages(app: Celery, queue: Queue, count: int, start: int = 0) -> list:
    return [
        functools.partial(
            app.send_task, "t", kwargs={"n": n}, queue=queue, routing_key=queue.routing_key, retry=False
        )
        for n in range(start, start + count)
    ]


def test_a_batch_counts_as_published_only_once_the_broker_confirmed_every_message(app, amqp_url):
    queue = declare(amqp_url, "batch-ok")
    publisher = BatchPublisher(app)
    try:
        publisher.publish(messages(app, queue, 40))
        assert not publisher._unconfirmed  # every delivery tag came back
        assert waiting(amqp_url, "batch-ok") == 40
        publisher.publish(messages(app, queue, 3, start=40))  # the same channel, tags go on
        assert waiting(amqp_url, "batch-ok") == 43
    finally:
        publisher.close()


def test_a_refused_message_fails_the_batch_and_the_next_batch_goes_on_a_new_channel(app, amqp_url):
    """A queue that refuses what does not fit (x-overflow reject-publish) nacks the third
    message: the batch raises, so the relay sends it again later, whole."""
    full = declare(amqp_url, "batch-full", **{"x-max-length": 2, "x-overflow": "reject-publish"})
    roomy = declare(amqp_url, "batch-roomy")
    publisher = BatchPublisher(app)
    try:
        with pytest.raises(MessageNacked):
            publisher.publish(messages(app, full, 3))
        assert waiting(amqp_url, "batch-full") == 2
        publisher.publish(messages(app, roomy, 5))
        assert waiting(amqp_url, "batch-roomy") == 5
    finally:
        publisher.close()


def test_a_connection_the_broker_dropped_while_idle_is_replaced_before_the_next_batch(app, amqp_url):
    queue = declare(amqp_url, "batch-stale")
    publisher = BatchPublisher(app)
    try:
        publisher.publish(messages(app, queue, 2))
        # The broker's side goes away between two polls (a restart, a cut connection).
        sock = publisher._connection.connection.sock
        sock.shutdown(socket.SHUT_WR)
        assert select.select([sock], [], [], 5)[0]  # the broker has closed its end
        publisher.publish(messages(app, queue, 2, start=2))
        assert waiting(amqp_url, "batch-stale") == 4
    finally:
        publisher.close()
