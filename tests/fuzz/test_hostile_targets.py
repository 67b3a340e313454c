"""Hostile targets against a real worker: whatever bytes a target answers, every run is
recorded, and another owner's run in the same dispatch is recorded as it finished.

The worker is the in-process one (real aiohttp calls, the completion buffer, Postgres,
Redis); the targets are raw sockets (tests/fuzz/raw_target.py) answering status lines,
headers and bodies drawn by hypothesis: statuses out of any range or not numbers,
Retry-After of thousands of digits, duplicated, not ASCII, headers over aiohttp's line
limit, bodies of any size, and bytes that are not HTTP at all.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app import metrics
from app.core.timefmt import utcnow
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.worker.context import WorkerContext
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.raw_target import RawTarget
from tests.rows import insert_jobs, job_row, runs_of, webhook_target

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

FINISHED = {"succeeded", "failed", "dead"}


@pytest.fixture(scope="module")
def stack(pg_dsns):
    from app.settings import Settings
    from tests.conftest import REDIS_URL, unique_redis_prefix

    with unique_redis_prefix("fuzz") as prefix:
        settings = Settings.from_env(
            {
                "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
                "PUNCTUAL_REDIS_URL": REDIS_URL,
                "PUNCTUAL_REDIS_PREFIX": prefix,
                "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
                "PUNCTUAL_DB_POOL_SIZE": "4",
            }
        )
        settings = dataclasses.replace(settings, lease_s=5.0, heartbeat_s=0.5)
        registry = registry_for(settings)
        create_key(registry, "hostile")
        create_key(registry, "other")
        target = RawTarget()
        context = WorkerContext(settings)
        yield context, registry, target
        context.close(5)
        target.close()


_NAMES = st.one_of(
    st.sampled_from(
        [
            b"Retry-After",
            b"retry-after",
            b"RETRY-AFTER",
            b"Content-Length",
            b"Transfer-Encoding",
            b"Content-Type",
        ]
    ),
    st.sampled_from([b"Location", b"Connection", b"Content-Encoding", b"X-A"]),
    st.binary(min_size=1, max_size=20),
)
_VALUES = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda text: text.encode("utf-8")),
    st.integers(0, 6000).map(lambda n: b"9" * n),
    st.sampled_from(
        [
            b"Mon, 01 Jun 99999 12:00:00 GMT",
            b"Fri, 31 Dec 9999 23:59:59 GMT",
            b"-1",
            b"0",
            b"\xd9\xa1\xd9\xa2",  # Arabic-Indic digits
            b"12\x85",
            b"chunked",
            b"gzip",
            b"1e9",
        ]
    ),
    st.integers(8000, 40_000).map(lambda n: b"x" * n),  # over aiohttp's header line limit
)
_STATUSES = st.one_of(
    st.integers(0, 1200).map(lambda n: str(n).encode()),
    st.sampled_from([b"200", b"503", b"429", b"301", b"404", b"99999999999999999999", b"-1", b"2OO"]),
    st.binary(max_size=6),
)


@st.composite
def raw_answers(draw) -> bytes:
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"XTTP/1.1", b""]))
    line = version + b" " + draw(_STATUSES) + b" " + draw(st.binary(max_size=20))
    headers = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=5))
    body = draw(st.one_of(st.binary(max_size=100), st.integers(0, 300_000).map(lambda n: b"b" * n)))
    return (
        line + b"\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n" + body
    )


def _dispatch_due(context, registry, rows) -> None:
    insert_jobs(registry, rows)
    found = []
    for shard in sorted({row["shard"] for row in rows}):
        found += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    context.dispatcher.dispatch(found)


def _finished_runs(registry, job_id, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = runs_of(registry, job_id)
        if runs and all(run["state"] in FINISHED for run in runs):
            return runs
        if time.monotonic() > deadline:
            raise AssertionError(f"runs of job {job_id} stuck: {[(r['attempt'], r['state']) for r in runs]}")
        time.sleep(0.05)


@fuzz_settings(examples=25)
@given(answers=st.lists(raw_answers(), min_size=1, max_size=5))
@example(answers=[b"HTTP/1.1 503 Busy\r\nRetry-After: " + b"9" * 400 + b"\r\nContent-Length: 0\r\n\r\n"])
@example(
    answers=[
        b"HTTP/1.1 503 X\r\nRetry-After: " + b"9" * 5000 + b"\r\nRetry-After: 1\r\n\r\n",
        b"HTTP/1.1 429 X\r\nRetry-After: \xd9\xa1\xd9\xa2\r\nX-\xff: \x00\x85\r\n\r\n",
        b"not http at all",
    ]
)
def test_no_answer_stops_the_worker_from_recording_any_owners_runs(stack, answers):
    context, registry, target = stack
    shards = registry.settings.shards
    due = utcnow() - timedelta(seconds=1)
    hostile = []
    for raw in answers:
        path = f"/hostile/{uuid.uuid4().hex}"
        target.answer(path, raw)
        url = target.url(path)
        # Two attempts, so that a Retry-After is read; a minute of backoff keeps the retry out of the test.
        hostile.append(
            job_row(
                shards,
                owner="hostile",
                run_at=due,
                target=webhook_target(url, timeout_s=2),
                max_attempts=2,
                backoff_s=60,
            )
        )
    other = job_row(
        shards, owner="other", run_at=due, target=webhook_target(target.url("/fine"), timeout_s=2)
    )
    given_up = metrics.COMPLETIONS_GIVEN_UP._value.get()
    _dispatch_due(context, registry, [*hostile, other])

    [recorded] = _finished_runs(registry, other["job_id"])
    assert recorded["state"] == "succeeded" and recorded["status_code"] == 200
    for row in hostile:
        for run in _finished_runs(registry, row["job_id"]):
            status = run["status_code"]
            assert status is None or 100 <= status <= 999
            assert run["state"] == "succeeded" or run["error"]
            assert run["error"] is None or len(run["error"]) <= 1000
            # Settled by the rules, at the first write: not by the fallbacks that keep a
            # batch going when an answer could not be settled or written.
            assert not (run["error"] or "").startswith(("the answer could not", "the outcome could not"))
    assert metrics.COMPLETIONS_GIVEN_UP._value.get() == given_up  # each was recorded, none given up
