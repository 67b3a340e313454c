"""Jitter: deterministic, in range, millisecond-grained and evenly spread."""

from __future__ import annotations

import hashlib
import statistics
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.jitter import fire_at, jitter_offset, parse_jitter_s
from app.core.timefmt import parse_instant

JOB = uuid.UUID("7f0c2a4e-1b9d-4c61-9a53-2f3e8d1c0b7a")
MIDNIGHT = parse_instant("2026-06-01T00:00:00Z")


def test_zero_jitter_is_no_delay():
    assert jitter_offset(JOB, MIDNIGHT, 0) == timedelta(0)
    assert fire_at(JOB, MIDNIGHT, 0) == MIDNIGHT


def test_negative_jitter_is_a_bug():
    with pytest.raises(ValueError):
        jitter_offset(JOB, MIDNIGHT, -1)


def test_pinned_value_from_the_documented_hash():
    # The contract: sha256 of "<job_id>:<nominal as RFC 3339 UTC Z>", first 8 bytes
    # big-endian, modulo jitter_s in milliseconds. Another process (or language) must
    # be able to reproduce it.
    digest = hashlib.sha256(b"7f0c2a4e-1b9d-4c61-9a53-2f3e8d1c0b7a:2026-06-01T00:00:00Z").digest()
    expected_ms = int.from_bytes(digest[:8], "big") % 60_000
    assert jitter_offset(JOB, MIDNIGHT, 60) == timedelta(milliseconds=expected_ms)
    assert fire_at(JOB, MIDNIGHT, 60) == MIDNIGHT + timedelta(milliseconds=expected_ms)


def test_deterministic_across_calls_and_id_spellings():
    once = jitter_offset(JOB, MIDNIGHT, 3600)
    assert jitter_offset(JOB, MIDNIGHT, 3600) == once
    assert jitter_offset(str(JOB), MIDNIGHT, 3600) == once
    assert jitter_offset(str(JOB).upper(), MIDNIGHT, 3600) == once
    # The nominal instant's own offset does not matter, only the instant.
    assert jitter_offset(JOB, parse_instant("2026-06-01T02:00:00+02:00"), 3600) == once


def test_non_uuid_ids_still_work():
    assert jitter_offset("job-1", MIDNIGHT, 10) == jitter_offset("job-1", MIDNIGHT, 10)
    assert timedelta(0) <= jitter_offset("job-1", MIDNIGHT, 10) < timedelta(seconds=10)


def test_occurrences_and_jobs_get_different_delays():
    per_occurrence = {jitter_offset(JOB, MIDNIGHT + timedelta(days=d), 3600) for d in range(50)}
    per_job = {jitter_offset(uuid.UUID(int=i), MIDNIGHT, 3600) for i in range(50)}
    assert len(per_occurrence) > 45 and len(per_job) > 45


@settings(max_examples=200, deadline=None)
@given(
    job=st.uuids(),
    seconds=st.integers(0, 10**9),
    micros=st.integers(0, 999_999),
    jitter_s=st.integers(1, 3600),
)
def test_property_range_and_millisecond_resolution(job, seconds, micros, jitter_s):
    nominal = MIDNIGHT + timedelta(seconds=seconds, microseconds=micros)
    offset = jitter_offset(job, nominal, jitter_s)
    assert timedelta(0) <= offset < timedelta(seconds=jitter_s)
    assert offset.microseconds % 1000 == 0
    assert fire_at(job, nominal, jitter_s) - nominal == offset


def test_spread_is_uniform_over_the_window():
    # 20,000 jobs due at midnight with jitter_s=60: each 6-second tenth of the minute
    # should hold ~2,000 of them (binomial sd ~42; allow 10%).
    offsets = [jitter_offset(uuid.UUID(int=i), MIDNIGHT, 60).total_seconds() for i in range(20_000)]
    buckets = Counter(int(o // 6) for o in offsets)
    assert set(buckets) == set(range(10))
    assert all(1800 <= n <= 2200 for n in buckets.values()), buckets
    assert 29.0 < statistics.fmean(offsets) < 31.0
    assert len(set(offsets)) > 15_000  # millisecond grain, not whole seconds


def test_one_second_jitter_uses_the_whole_second():
    offsets = {jitter_offset(uuid.UUID(int=i), MIDNIGHT, 1) for i in range(2000)}
    assert max(offsets) >= timedelta(milliseconds=990)
    assert min(offsets) <= timedelta(milliseconds=10)


@pytest.mark.parametrize("value, expected", [(0, 0), (1, 1), (3600, 3600), (30.0, 30)])
def test_parse_jitter_s_accepts(value, expected):
    assert parse_jitter_s(value) == expected


@pytest.mark.parametrize("value", [-1, 3601, 1.5, "10", True, None])
def test_parse_jitter_s_rejects(value):
    with pytest.raises(ValueError):
        parse_jitter_s(value)
