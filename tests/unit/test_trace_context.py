"""The W3C trace context of a call (app.tracing): the run is the trace."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from app import tracing
from app.core.delivery import delivery_headers, is_reserved_header

RUN = uuid.UUID("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9")


def test_the_trace_id_is_the_run_id_and_the_parent_its_low_half_or_the_call_span():
    assert tracing.traceparent(RUN) == "00-0f1e2d3c4b5a49788695a4b3c2d1e0f9-8695a4b3c2d1e0f9-01"
    assert tracing.traceparent(RUN, 0xABC) == "00-0f1e2d3c4b5a49788695a4b3c2d1e0f9-0000000000000abc-01"


@pytest.mark.parametrize(
    "header, run",
    [
        ("00-0f1e2d3c4b5a49788695a4b3c2d1e0f9-8695a4b3c2d1e0f9-01", RUN),
        (" 00-0f1e2d3c4b5a49788695a4b3c2d1e0f9-0000000000000001-00 ", RUN),
        (None, None),
        ("", None),
        ("00-xyz-8695a4b3c2d1e0f9-01", None),
        ("00-0f1e2d3c4b5a49788695a4b3c2d1e0fz-8695a4b3c2d1e0f9-01", None),
    ],
)
def test_the_run_is_read_back_from_a_traceparent(header, run):
    assert tracing.run_of(header) == run


def test_a_claims_span_id_is_the_runs_and_its_tokens():
    token, other = uuid.uuid4(), uuid.uuid4()
    assert tracing.claim_span_id(RUN, token) == tracing.claim_span_id(RUN, token)
    assert tracing.claim_span_id(RUN, token) != tracing.claim_span_id(RUN, other)
    assert 0 < tracing.claim_span_id(RUN, token) < 2**64


def test_the_trace_context_is_punctuals_to_set():
    assert is_reserved_header("traceparent") and is_reserved_header("TraceState")
    headers = delivery_headers(
        job_id="j",
        scheduled_for=datetime(2026, 1, 1, tzinfo=UTC),
        attempt=1,
        body=b"{}",
        signing_secrets=("s",),
        traceparent=tracing.traceparent(RUN),
    )
    assert headers["traceparent"] == tracing.traceparent(RUN)
