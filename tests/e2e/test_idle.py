"""An idle stack sends no polls, and a job created for now is still claimed and run:
a real beat (at DEBUG, so that it says what it sends and what it leaves out), a real
worker, real Postgres and RabbitMQ, the shipped poll interval."""

from __future__ import annotations

import re

import pytest

from app.core.timefmt import format_instant, utcnow
from app.registry.sharding import shard_for
from tests.e2e.conftest import make_env
from tests.e2e.processes import CELERY, Proc, start_worker, wait_ready

pytestmark = pytest.mark.e2e

SENT = re.compile(r"sending due task (poll|sweep)-shard-(\d+)")
SKIPPED = re.compile(r"not sending poll-shard-(\d+)")


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix):
    env = make_env(pg_dsns, amqp_url, module_redis_prefix)
    env.pop("PUNCTUAL_POLL_INTERVAL_S")  # the shipped interval: the idle case as deployed
    return env


@pytest.fixture(scope="module")
def idle_stack(stack_env, logs):
    worker = start_worker(stack_env, logs)
    beat = Proc("beat", [CELERY, "-A", "app", "beat", "--loglevel", "DEBUG"], stack_env, logs)
    wait_ready(worker)
    wait_ready(beat)
    yield beat
    beat.stop()
    worker.stop()


def beat_lines(beat: Proc) -> list[str]:
    return beat.log_path.read_text(errors="replace").splitlines()


def wait_for(beat: Proc, condition, what: str, timeout_s: float = 60.0) -> list[str]:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = beat_lines(beat)
        if condition(lines):
            return lines
        assert beat.alive(), beat.tail()
        time.sleep(0.2)
    raise AssertionError(f"beat never {what}:\n{beat.tail()}")


def skipped_rounds(lines: list[str], shards: int) -> int:
    counts = [0] * shards
    for line in lines:
        if match := SKIPPED.search(line):
            counts[int(match.group(1))] += 1
    return min(counts)


def test_an_idle_stack_sends_no_poll_and_a_job_for_now_still_runs(idle_stack, settings, api, sink):
    beat = idle_stack
    # Three rounds in which beat left every shard's poll out.
    lines = wait_for(beat, lambda ls: skipped_rounds(ls, settings.shards) >= 3, "left the polls out")
    assert not [line for line in lines if "sending due task poll-" in line]

    job = api.create(
        target={"type": "webhook", "url": sink.url("/idle")},
        schedule={"run_at": format_instant(utcnow())},
    )
    api.wait_job(job["id"], lambda j: j["state"] == "completed")
    assert [r["state"] for r in api.runs(job["id"])] == ["succeeded"]
    assert sink.calls("/idle")
    shard = shard_for(job["id"], settings.shards)
    polled = {
        int(m.group(2)) for line in beat_lines(beat) if (m := SENT.search(line)) and m.group(1) == "poll"
    }
    assert polled == {shard}
