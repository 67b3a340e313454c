"""A worker takes its messages as fast as the broker hands them out, however many it
already holds for their eta (app.tasks.turnstile.settle_prefetch).

Each message held for its eta widens the consumer's prefetch window by one, but
Celery sends a changed window once per turn of its loop, and the messages read while
it waits for the broker's answer widen it again with nothing left to send it: the
worker then sleeps until its next timer. Before the fix a worker holding a burst
claimed ahead took about 7 messages a second, and the polls queued behind them expired.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery import Celery
from kombu import Connection

from app.core.timefmt import utcnow
from app.lifecycle.message import message_headers
from app.registry.sharding import queue_name
from app.tasks.routing import DISPATCH_TASK
from tests.e2e.conftest import make_env
from tests.e2e.processes import start_worker, wait_ready

pytestmark = pytest.mark.e2e

HELD = 400  # messages held for an eta a minute ahead


def _ready(amqp_url: str, queue: str) -> int:
    """Messages in `queue` not yet handed to a consumer."""
    with Connection(amqp_url) as conn:
        _name, count, _consumers = conn.channel().queue_declare(queue, passive=True)
        return count


def test_a_worker_holding_hundreds_of_messages_for_their_eta_still_takes_every_message_at_once(
    pg_dsns, amqp_url, module_redis_prefix, logs
):
    env = make_env(pg_dsns, amqp_url, module_redis_prefix + ":prefetch")
    worker = start_worker(env, logs, name="prefetch-worker")
    try:
        wait_ready(worker)
        queue = queue_name(0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the worker has declared its queue and consumes
            try:
                _ready(amqp_url, queue)
                break
            except Exception:
                time.sleep(0.2)
        producer = Celery("probe", broker=amqp_url)
        eta = utcnow() + timedelta(seconds=60)
        with producer.connection_for_write() as conn:
            for _ in range(HELD):
                producer.send_task(
                    DISPATCH_TASK,
                    kwargs={"shard": 0, "runs": []},
                    eta=eta,
                    queue=queue,
                    headers=message_headers([]),
                    connection=conn,
                )
        started = time.monotonic()
        left = HELD
        while time.monotonic() - started < 10 and (left := _ready(amqp_url, queue)) > 0:
            time.sleep(0.2)
        assert left == 0, (
            f"{left} of {HELD} messages still in the queue {time.monotonic() - started:.1f} s after they "
            f"were published: the worker's prefetch window is not being sent\n{worker.tail()}"
        )
    finally:
        worker.kill()
