"""Trace context: a W3C `traceparent` on every call, and OpenTelemetry spans when asked.

Each run is a trace whose id is the run id (its 32 hex digits, `run_id.hex`), so a
receiver finds the run in the header it got: `traceparent:
00-<run id, no dashes>-<parent span id>-01`. The flag says sampled, so a receiver
whose sampler follows its parent records its side of the call.

With opentelemetry-sdk installed (`pip install 'punctual[otel]'`) and
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, the workers
export three spans a run over OTLP/HTTP, batched (the SDK's OTEL_* variables apply):
`punctual.claim`, the trace's root, when a poller claimed the run (or, for a
triggered, replayed or backfilled run, when the relay sweep took it to publish);
`punctual.dispatch`, the worker's admission and start; `punctual.call`, the webhook
request or the queue publish, whose id is the `traceparent` parent the target
receives. A claim span's id is derived from the run id and its lease token, so the
worker names it as the dispatch's parent without anything on the broker.

Without it (the default) `spans()` is None: nothing is imported, the hot path asks
one global, and a call's header is one format of the run id (its parent id is the
run id's low 64 bits).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import uuid
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("punctual.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SAMPLED = "01"


def traceparent(run_id: uuid.UUID, span_id: int | None = None) -> str:
    """The `traceparent` of a call of run `run_id`: its trace is the run; the parent is
    `span_id` (the call's span), or the run id's low 64 bits without spans."""
    hexed = run_id.hex
    parent = hexed[16:] if span_id is None else f"{span_id:016x}"
    return f"00-{hexed}-{parent}-{_SAMPLED}"


def run_of(header: str | None) -> uuid.UUID | None:
    """The run a `traceparent` belongs to (its trace id), or None for another header."""
    parts = (header or "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    try:
        return uuid.UUID(hex=parts[1])
    except ValueError:
        return None


def claim_span_id(run_id: uuid.UUID, lease_token: uuid.UUID) -> int:
    """The span id of a run's claim under one lease token, known to the poller that made
    it and to the worker that starts the run (a run held and claimed again under a new
    token is a new claim)."""
    digest = hashlib.blake2b(run_id.bytes + lease_token.bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


class Spans:
    """The spans of runs, on one OpenTelemetry tracer provider."""

    def __init__(self, provider: Any):
        from opentelemetry import trace

        self._trace = trace
        self._provider = provider
        self._tracer = provider.get_tracer("punctual")

    def claimed(self, runs: Iterable[Any], start_ns: int, end_ns: int, by: str) -> None:
        """A root `punctual.claim` span for each run (DispatchRun) claimed `by` the
        claim or the relay sweep, between `start_ns` and `end_ns`."""
        for run in runs:
            token = _forced.set((run.run_id.int, claim_span_id(run.run_id, run.lease_token)))
            try:
                span = self._tracer.start_span(
                    "punctual.claim",
                    context=_ROOT_CONTEXT,
                    start_time=start_ns,
                    attributes={**_attributes(run), "punctual.claimed_by": by},
                )
            finally:
                _forced.reset(token)
            span.end(end_time=end_ns)

    def dispatched(self, run: Any, start_ns: int, end_ns: int, outcome: str) -> Any:
        """The run's `punctual.dispatch` span (admission and start, `outcome` started,
        held or stale), child of its claim; returns its context, the call's parent."""
        span = self._tracer.start_span(
            "punctual.dispatch",
            context=self._remote(run.run_id.int, claim_span_id(run.run_id, run.lease_token)),
            start_time=start_ns,
            attributes={**_attributes(run), "punctual.dispatch.outcome": outcome},
        )
        span.end(end_time=end_ns)
        return span.get_span_context()

    def call(self, run: Any, parent: Any) -> tuple[Any, str]:
        """Start the run's `punctual.call` span under `parent` (a dispatch's context);
        returns it and the `traceparent` its request carries. End it with `called`."""
        span = self._tracer.start_span(
            "punctual.call",
            context=self._trace.set_span_in_context(self._trace.NonRecordingSpan(parent)),
            attributes={**_attributes(run), "punctual.target.type": run.target.get("type", "webhook")},
        )
        return span, traceparent(run.run_id, span.get_span_context().span_id)

    def called(self, span: Any, outcome: Any) -> None:
        """End a call span with its CallOutcome (None: the call was withdrawn)."""
        from opentelemetry.trace import Status, StatusCode

        if outcome is None:
            span.set_status(Status(StatusCode.ERROR, "not sent: the run's lease was lost"))
        else:
            if outcome.status_code is not None:
                span.set_attribute("http.response.status_code", outcome.status_code)
            if not outcome.succeeded:
                span.set_status(Status(StatusCode.ERROR, outcome.error or f"HTTP {outcome.status_code}"))
        span.end()

    def _remote(self, trace_id: int, span_id: int) -> Any:
        trace = self._trace
        parent = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(1))
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))

    def flush(self) -> None:
        self._provider.force_flush()


def _attributes(run: Any) -> dict[str, Any]:
    return {
        "punctual.run_id": str(run.run_id),
        "punctual.job_id": str(run.job_id),
        "punctual.owner": run.owner,
        "punctual.shard": run.shard,
        "punctual.origin": run.origin,
        "punctual.attempt": run.attempt,
    }


# (trace id, span id) the next root span takes: a claim span's ids are the run's.
_forced: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("punctual_ids", default=None)
_ROOT_CONTEXT: Any = None
_spans: Spans | None = None
_decided = False


def spans() -> Spans | None:
    """This process's Spans, or None when not exporting (decided once per process,
    at first use: after a prefork worker's fork, since the exporter runs a thread)."""
    if _decided:
        return _spans
    return _start()


def _start() -> Spans | None:
    global _decided
    _decided = True
    if not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-sdk is not installed"
            " (pip install 'punctual[otel]'): no spans are exported"
        )
        return None
    return configure(BatchSpanProcessor(OTLPSpanExporter()))


def configure(processor: Any) -> Spans:
    """Export this process's spans through `processor` (an OpenTelemetry span
    processor: the OTLP exporter's batch, or a test's in-memory exporter)."""
    global _spans, _decided, _ROOT_CONTEXT
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIds(RandomIdGenerator):
        """A root span's ids are the run's while `_forced` says so (claim spans)."""

        def generate_span_id(self) -> int:
            forced = _forced.get()
            return forced[1] if forced is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _forced.get()
            return forced[0] if forced is not None else super().generate_trace_id()

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "punctual"}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=RunIds())
    provider.add_span_processor(processor)
    _ROOT_CONTEXT = Context()
    _spans, _decided = Spans(provider), True
    return _spans


def reset() -> None:
    """Forget this process's choice (a forked child decides anew; tests)."""
    global _spans, _decided
    _spans, _decided = None, False


os.register_at_fork(after_in_child=reset)
