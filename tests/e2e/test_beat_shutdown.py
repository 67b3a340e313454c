"""`celery -A app beat` stops within seconds of SIGTERM, every time.

Real beat processes on a fresh RabbitMQ vhost. Each is sent SIGTERM at a random
moment of its life (while it connects, between ticks, while it publishes); one more
talks to the broker through a proxy that stops answering, the case that once kept
beat alive for 2.5 minutes: a publish waiting for its confirm, then a connection
close waiting for the broker's close-ok. STOP_WITHIN_S is a bound on a deadlock,
not a speed target: a healthy beat stops in well under a second.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from app.core.timefmt import utcnow
from app.registry.engines import registry_for
from app.settings import Settings
from tests.e2e.processes import start_beat
from tests.rows import insert_jobs, job_row
from tests.tcp_proxy import FreezingProxy

pytestmark = pytest.mark.e2e

STOP_WITHIN_S = 10.0


def _stop(beat, what: str) -> None:
    beat.popen.send_signal(signal.SIGTERM)
    try:
        beat.popen.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        beat.kill()
        pytest.fail(f"beat did not stop within {STOP_WITHIN_S:g} s of SIGTERM ({what}):\n{beat.tail()}")
    finally:
        beat.stop()


def test_beat_stops_within_seconds_of_sigterm_at_random_moments(stack_env, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for attempt in range(4):
        beat = start_beat(stack_env, tmp_path, name=f"beat-{attempt}")
        delay = rng.uniform(0.1, 4.0)
        time.sleep(delay)
        _stop(beat, f"attempt {attempt}, {delay:.2f} s after start, seed {seed}")


def test_beat_stops_on_sigterm_while_the_broker_has_stopped_answering(stack_env, tmp_path):
    # A job due and no worker to claim it: beat polls its shard every tick, publishing.
    settings = Settings.from_env(stack_env)
    insert_jobs(registry_for(settings), [job_row(settings.shards, run_at=utcnow())])
    broker = urlsplit(stack_env["PUNCTUAL_BROKER_URL"])
    proxy = FreezingProxy((broker.hostname, broker.port or 5672))
    try:
        netloc = f"{broker.username}:{broker.password}@127.0.0.1:{proxy.port}"
        proxied = urlunsplit(broker._replace(netloc=netloc))
        beat = start_beat({**stack_env, "PUNCTUAL_BROKER_URL": proxied}, tmp_path)
        deadline = time.monotonic() + 30
        while proxy.forwarded_bytes < 4096 and time.monotonic() < deadline:  # connected and publishing
            assert beat.alive(), beat.tail()
            time.sleep(0.2)
        assert proxy.forwarded_bytes >= 4096, f"beat never talked to the broker:\n{beat.tail()}"
        proxy.freeze()
        time.sleep(1.5)  # beat's next publish now waits for a confirm that never comes
        assert beat.alive(), beat.tail()
        _stop(beat, "broker silent")
    finally:
        proxy.close()
