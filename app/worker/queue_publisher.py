"""Queue targets: one confirmed AMQP publish per attempt, turned into a CallOutcome.

A queue target `{"type": "queue", "topic": "reports.daily"}` is published to the
durable topic exchange `punctual.jobs` (declared here, on first use of each
connection) with the topic as routing key. The message is what a webhook would
receive: the payload as compact JSON and the same headers, as AMQP string headers
(app.core.delivery); it is persistent.

An attempt succeeds only when the broker confirms the publish (publisher confirms:
the `confirm_publish` transport option); a nack, a confirm that does not come in
time or a connection failure is an error outcome, retried by the registry like any
other. Note that a confirmed message that no queue is bound to is dropped by the
broker: routing is the owner's business, as a webhook's answer is the target's.

One `QueuePublisher` serves all the dispatch threads of a worker process: each
publish borrows a connection from a kombu connection pool, so a connection is only
used by one thread at a time, and a connection that fails is thrown away (the pool
opens a new one for the next publish). A connection the broker closed while it
sat idle in the pool (a broker restart) is noticed before publishing, and replaced.
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from amqp.exceptions import MessageNacked
from kombu import Connection, Exchange, Producer

from app.core.delivery import delivery_headers, encode_payload
from app.core.retries import CallOutcome

__all__ = ["EXCHANGE", "QueueCall", "QueuePublisher"]

EXCHANGE = Exchange("punctual.jobs", type="topic", durable=True)


@dataclass(frozen=True)
class QueueCall:
    """One attempt of one run against a queue target."""

    job_id: str
    scheduled_for: datetime
    attempt: int
    topic: str
    payload: Any
    signing_secrets: tuple[str, ...]  # the current secret first; the previous one too in a rotation window
    traceparent: str | None = None  # the call's W3C trace context (app.tracing): an AMQP header too


class QueuePublisher:
    """Publishes queue targets with publisher confirms; safe to share across threads."""

    def __init__(
        self,
        broker_url: str,
        pool_size: int = 16,
        confirm_timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        transport_options: dict | None = None,
        transport: str | None = None,
    ):
        """`transport` and `transport_options` are the Celery app's broker_transport
        and broker_transport_options (the embedded filesystem transport of
        `punctual dev` is a class of its own and needs its data folders there)."""
        self.confirm_timeout_s = confirm_timeout_s
        # max_retries=0: kombu's default is to retry connecting forever, which
        # would park a dispatch thread while the broker is down. A failed attempt
        # goes back to the registry, which retries with backoff.
        self._connection = Connection(
            broker_url,
            transport=transport,
            connect_timeout=connect_timeout_s,
            transport_options={**(transport_options or {}), "confirm_publish": True, "max_retries": 0},
        )
        self._pool = self._connection.Pool(limit=pool_size)
        # Waiting for a pooled connection longer than a confirm would take is a failure too.
        self._acquire_timeout_s = confirm_timeout_s + connect_timeout_s

    def close(self) -> None:
        self._pool.force_close_all()

    def publish(self, call: QueueCall) -> CallOutcome:
        """Publish once and wait for the broker's confirm; never raises."""
        try:
            body = encode_payload(call.payload)
        except (TypeError, ValueError) as exc:
            return CallOutcome(error=f"cannot encode the message: {exc}", retryable_error=False)
        headers = delivery_headers(
            job_id=call.job_id,
            scheduled_for=call.scheduled_for,
            attempt=call.attempt,
            body=body,
            signing_secrets=call.signing_secrets,
            traceparent=call.traceparent,
        )
        try:
            # A PooledConnection that sees an exception inside `with` is closed
            # and replaced, so a broken connection is never handed out again.
            with self._pool.acquire(block=True, timeout=self._acquire_timeout_s) as connection:
                if went_stale(connection):
                    connection.collect()  # default_channel below opens a fresh one
                producer = Producer(connection.default_channel, exchange=EXCHANGE, auto_declare=False)
                producer.publish(
                    body,
                    routing_key=call.topic,
                    headers=headers,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,  # persistent
                    message_id=headers["Idempotency-Key"],
                    declare=[EXCHANGE],  # once per connection (kombu caches declarations)
                    retry=False,  # one publish per attempt; the registry retries
                    confirm_timeout=self.confirm_timeout_s,
                )
        except MessageNacked:
            return CallOutcome(error=f"the broker refused the message for topic {call.topic!r} (nack)")
        except Exception as exc:  # connection refused or lost, confirm timeout, no pooled connection
            return CallOutcome(error=f"publish to topic {call.topic!r} failed: {type(exc).__name__}: {exc}")
        return CallOutcome(status_code=None)


def went_stale(connection: Connection) -> bool:
    """True when the broker spoke while this open connection sat idle in the pool.

    Between two confirmed publishes the broker owes a publisher nothing, so anything
    readable (a connection.close before a restart, an EOF) means the connection is
    going away. Replacing it before the publish, rather than failing on it, saves
    the run an attempt. Nothing is read: select() only looks.
    """
    if not connection.connected:
        return False  # not opened yet, or known broken: default_channel (re)connects
    sock = getattr(connection.connection, "sock", None)
    if sock is None:  # an in-process transport (`punctual dev`): nothing to go stale
        return False
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)
