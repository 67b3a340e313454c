"""A relay batch's dispatch messages, published together and confirmed together.

Celery publishes with publisher confirms (`confirm_publish`, celeryconfig): each
apply_async waits for RabbitMQ's confirm of its one message before the next is sent.
At a steady load a poll's claim becomes about ten small messages (one per eta step),
so a poll spent most of its time waiting for ten round trips through the broker, in
a pool process that could have started runs meanwhile. Here a batch's messages are
all sent on one channel in confirm mode, and the confirms are awaited once: the
broker confirms each message, or several at once (`multiple`). The batch counts as
published only when every message is confirmed; a nack, a confirm that does not come
within `confirm_timeout_s` or a connection failure raises, and the relay sends the
whole batch again (a duplicate message is harmless: its start is fenced).

One `BatchPublisher` per process, used by the task that is running (a pool process
runs one at a time; the lock makes it safe regardless). Its connection is its own,
without heartbeats (nothing would send them while it sits idle between polls), and
is replaced after any failure, or when the broker spoke while it sat idle (a close
before a restart).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

from amqp.exceptions import MessageNacked
from celery import Celery
from kombu import Connection, Producer

from app.worker.queue_publisher import went_stale

# publish(producer=...) sends one message with that producer.
Publish = Callable[..., None]


class BatchPublisher:
    def __init__(self, app: Celery, confirm_timeout_s: float = 10.0):
        self._app = app
        self.confirm_timeout_s = confirm_timeout_s
        self._lock = threading.Lock()
        self._pid = 0
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._sent = 0  # messages published on the channel since its confirm.select
        self._unconfirmed: set[int] = set()  # their delivery tags not confirmed yet
        self._nacked = False

    def publish(self, messages: Sequence[Publish]) -> None:
        """Call each of `messages` as `publish(producer=...)` with the confirm channel's
        producer (each publishes one message, with retry=False: a retry belongs to the
        whole batch), then wait until the broker confirmed them all."""
        with self._lock:
            try:
                producer = self._ready_producer()
                for publish in messages:
                    publish(producer=producer)
                    self._sent += 1
                    self._unconfirmed.add(self._sent)
                self._wait_for_confirms()
            except BaseException:
                self._drop()
                raise

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _ready_producer(self) -> Producer:
        if self._pid != os.getpid():  # a connection is never shared with a forked child
            self._connection = self._producer = None
            self._pid = os.getpid()
        if self._connection is not None and went_stale(self._connection):
            self._drop()
        if self._producer is None:
            # The app's own broker settings, but confirms handled here, not per publish.
            connection = self._app.connection_for_write(transport_options={"confirm_publish": False})
            channel = connection.default_channel
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            self._connection, self._producer = connection, Producer(channel, auto_declare=False)
            self._sent, self._unconfirmed, self._nacked = 0, set(), False
        return self._producer

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self._unconfirmed = {tag for tag in self._unconfirmed if tag > delivery_tag}
        else:
            self._unconfirmed.discard(delivery_tag)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._nacked = True
        self._on_ack(delivery_tag, multiple)

    def _wait_for_confirms(self) -> None:
        assert self._connection is not None
        deadline = time.monotonic() + self.confirm_timeout_s
        while self._unconfirmed and not self._nacked:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self._unconfirmed)} dispatch messages not confirmed in time")
            self._connection.drain_events(timeout=left)
        if self._nacked:
            raise MessageNacked("the broker refused a dispatch message (nack)")

    def _drop(self) -> None:
        connection, self._connection, self._producer = self._connection, None, None
        self._unconfirmed, self._nacked = set(), False
        if connection is not None:
            try:
                connection.close()
            except Exception:  # already broken: nothing to close cleanly
                pass
