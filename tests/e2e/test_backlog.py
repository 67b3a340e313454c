"""A backlog longer than the lease expires no lease while its worker lives.

A worker with 4 call threads gets 40 runs due at once whose calls take 0.5 s: the
last ones start some 5 s after their instant, well past the 3 s lease of this
module. Their messages wait in the broker and in the worker meanwhile; none may be
taken back by the janitor (which would spend an attempt and claim them again). Some
of the jobs are also behind a cap of 2 of their own, waiting for slots."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from app.core.timefmt import format_instant, utcnow
from app.pollers.janitor import expire
from app.registry.engines import registry_for
from tests.e2e.conftest import make_env
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.sink import Answer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix) -> dict[str, str]:
    return make_env(pg_dsns, amqp_url, module_redis_prefix, PUNCTUAL_DISPATCH_THREADS="4")


def janitor_loop(settings, stop: threading.Event, expired: list[int]) -> None:
    """The janitor's sweep, run from here every 0.3 s: the worker's own sweep tasks
    wait behind its dispatch messages, so they would not show a premature expiry."""
    registry = registry_for(settings)
    while not stop.wait(0.3):
        for shard in range(settings.shards):
            expired[0] += expire(registry.engine_for_shard(shard), shard, utcnow(), settings)


def test_a_backlog_longer_than_the_lease_expires_no_lease(stack_env, settings, logs, sink, api):
    sink.script("/backlog", [Answer(200, delay_s=0.5)])
    sink.script("/capped", [Answer(200, delay_s=0.5)])
    worker = start_worker(stack_env, logs, name="busy", concurrency=1)
    beat = start_beat(stack_env, logs)
    stop, expired = threading.Event(), [0]
    janitor = threading.Thread(target=janitor_loop, args=(settings, stop, expired), daemon=True)
    try:
        wait_ready(worker, 1.0)
        janitor.start()
        due = format_instant(utcnow() + timedelta(seconds=2))
        plain = {"type": "webhook", "url": sink.url("/backlog")}
        capped = {
            "type": "webhook",
            "url": sink.url("/capped"),
            "limits": {"key": "capped", "max_concurrency": 2},
        }
        created = [api.create(target=plain, schedule={"run_at": due}) for _ in range(32)]
        created += [api.create(target=capped, schedule={"run_at": due}) for _ in range(8)]
        for job in created:
            api.wait_job(job["id"], lambda j: j["state"] == "completed", timeout_s=60)
        assert expired[0] == 0
        for job in created:
            [run] = api.runs(job["id"])  # one run each: no lease expired, no second claim
            assert run["state"] == "succeeded" and run["attempt"] == 1
        late = max(run["lateness_ms"] for job in created for run in api.runs(job["id"]))
        assert late > 3000  # the backlog did outlast the lease
        assert len(sink.calls("/backlog")) == 32 and len(sink.calls("/capped")) == 8
    finally:
        stop.set()
        beat.stop()
        worker.stop()
