"""Trace context: every call carries its run's W3C traceparent, and with the
OpenTelemetry SDK (its in-memory exporter here) a run's claim, dispatch and call are
one trace, whose id is the run id."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from app import tracing
from app.core.timefmt import utcnow
from app.pollers import relay
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.services.jobs import trigger_job
from app.services.owners import create_key
from app.worker.context import WorkerContext
from tests.rows import insert_jobs, job_row, webhook_target
from tests.sink import Sink

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    server = Sink()
    yield server
    server.close()


@pytest.fixture
def env(pg_settings, truncate):
    truncate()
    settings = dataclasses.replace(pg_settings, lease_s=5.0, heartbeat_s=1.0)
    registry = registry_for(settings)
    create_key(registry, "tests")
    context = WorkerContext(settings)
    yield context, registry
    context.close(5)
    tracing.reset()


@pytest.fixture
def exported():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.configure(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.reset()


def _claim(registry, rows) -> list:
    insert_jobs(registry, rows)
    return [
        run
        for shard in sorted({row["shard"] for row in rows})
        for run in claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    ]


def test_a_call_carries_its_runs_traceparent_without_any_exporter(env, sink):
    context, registry = env
    tracing.reset()
    row = job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/plain")))
    [run] = _claim(registry, [row])
    assert tracing.spans() is None
    assert context.dispatcher.dispatch([run]).started == 1
    [call] = sink.wait_for(1, "/plain")
    header = call.header("traceparent")
    assert header == f"00-{run.run_id.hex}-{run.run_id.hex[16:]}-01"
    assert tracing.run_of(header) == run.run_id


def test_a_runs_claim_dispatch_and_call_are_one_trace_named_by_the_run(env, sink, exported):
    context, registry = env
    row = job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(sink.url("/traced")))
    [run] = _claim(registry, [row])
    assert context.dispatcher.dispatch([run]).started == 1
    [call] = sink.wait_for(1, "/traced")

    def spans_named(name: str):
        return [span for span in exported.get_finished_spans() if span.name == name]

    [claim] = spans_named("punctual.claim")
    [dispatch] = spans_named("punctual.dispatch")
    deadline = utcnow() + timedelta(seconds=10)
    while not spans_named("punctual.call") and utcnow() < deadline:  # it ends after the answer
        time.sleep(0.05)
    [called] = spans_named("punctual.call")
    assert {span.context.trace_id for span in (claim, dispatch, called)} == {run.run_id.int}
    assert claim.parent is None and claim.context.span_id == tracing.claim_span_id(
        run.run_id, run.lease_token
    )
    assert dispatch.parent.span_id == claim.context.span_id
    assert called.parent.span_id == dispatch.context.span_id
    assert call.header("traceparent") == f"00-{run.run_id.hex}-{called.context.span_id:016x}-01"
    assert claim.attributes["punctual.claimed_by"] == "claim"
    assert dispatch.attributes["punctual.dispatch.outcome"] == "started"
    assert called.attributes["http.response.status_code"] == 200
    assert claim.attributes["punctual.run_id"] == str(run.run_id)
    assert claim.resource.attributes["service.name"] == "punctual"


def test_an_off_schedule_runs_trace_begins_at_the_relay_sweep(env, sink, exported):
    context, registry = env
    row = job_row(
        16, cron="0 0 1 1 *", first=utcnow() + timedelta(days=30), target=webhook_target(sink.url("/t"))
    )
    insert_jobs(registry, [row])
    triggered = trigger_job(registry, "tests", str(row["job_id"]), utcnow())
    sent: list = []
    engine = registry.engine_for_shard(row["shard"])
    assert relay.sweep(engine, row["shard"], utcnow(), lambda shard, messages: sent.append(messages)) == 1
    [claim] = exported.get_finished_spans()
    assert claim.context.trace_id == triggered["run_id"].int
    assert claim.attributes["punctual.claimed_by"] == "relay sweep"
    assert claim.attributes["punctual.origin"] == "trigger"
    assert claim.context.span_id == tracing.claim_span_id(triggered["run_id"], triggered["lease_token"])


def test_without_the_sdk_nothing_is_exported_and_the_header_is_still_sent(tmp_path):
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import logging, uuid; logging.basicConfig()\n"
        "from app import tracing\n"
        "assert tracing.spans() is None\n"
        "run = uuid.UUID('12345678-1234-4234-9234-123456789abc')\n"
        "print(tracing.traceparent(run))\n"
    )
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "00-12345678123442349234123456789abc-9234123456789abc-01"
    assert "opentelemetry-sdk is not installed" in result.stderr
