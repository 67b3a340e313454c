"""The benchmarks' pure helpers: the nginx access-log parser and the burst figures.

The bench is never run by the tests; only the arithmetic that turns a sink's log
into the published figures is pinned here, since a wrong percentile or a missed
duplicate would make every comparison wrong without any run failing.
"""

import math

from bench.figures import Arrival, burst_figures, lateness_figures, per_second, percentile
from bench.nginx import LOG_FORMAT, parse_access_line


def test_access_line_with_every_header():
    line = "1796062350.211 /hook/17 2 0191f0b2-aa:2026-11-30T18:00:00Z 2026-11-30T18:00:00Z\n"
    assert parse_access_line(line) == Arrival(
        at=1796062350.211,
        path="/hook/17",
        attempt="2",
        key="0191f0b2-aa:2026-11-30T18:00:00Z",
        scheduled_for="2026-11-30T18:00:00Z",
    )


def test_access_line_missing_headers_are_empty():
    arrival = parse_access_line("1796062350.5 /hook/3 - pgq-3 -")
    assert (arrival.attempt, arrival.key, arrival.scheduled_for) == ("", "pgq-3", "")


def test_access_line_that_is_not_one_is_skipped():
    assert parse_access_line("") is None
    assert parse_access_line("garbage /hook/1 - - -") is None
    assert parse_access_line("1.0 /hook/1 - -") is None  # a field short


def test_the_log_format_has_the_fields_the_parser_reads():
    assert LOG_FORMAT.split() == [
        "$msec",
        "$request_uri",
        "$http_punctual_attempt",
        "$http_idempotency_key",
        "$http_punctual_scheduled_for",
    ]


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7.0
    assert percentile(reversed(values), 0.9) == 90
    assert math.isnan(percentile([], 0.5))


def test_lateness_figures_of_nothing_are_none():
    assert lateness_figures([]) == {"p50": None, "p90": None, "p99": None, "max": None}
    assert lateness_figures([0.5, 1.25, 2.0]) == {"p50": 1.25, "p90": 2.0, "p99": 2.0, "max": 2.0}


def test_per_second_bins_from_due():
    assert per_second([0.1, 0.9, 1.0, 3.5, -0.2]) == [3, 1, 0, 1]
    assert per_second([]) == []


def arrival(at, i, key=None, attempt="1"):
    return Arrival(at=at, path=f"/hook/{i}", attempt=attempt, key=key or f"k{i}", scheduled_for="")


def test_burst_figures_first_arrival_per_job_missing_and_duplicates():
    due = 1000.0
    arrivals = [
        arrival(1000.5, 0),
        arrival(1001.0, 1),
        arrival(1004.0, 2),
        arrival(1010.0, 1, attempt="2"),  # job 1 called again: the same key
        arrival(1002.0, 99),
    ]  # not a job of this burst
    figures = burst_figures(arrivals, jobs=4, due=due, paths={f"/hook/{i}" for i in range(4)})
    assert figures["started"] == 3
    assert figures["missing"] == 1  # job 3 never called
    assert figures["duplicate_calls"] == 1
    assert figures["paths_called_twice"] == 1
    assert figures["retried_attempts"] == 1
    assert figures["first_arrival_after_due_s"] == 0.5
    assert figures["last_first_arrival_after_due_s"] == 4.0  # job 1's second call does not count
    assert figures["starts_per_s"] == 0.8  # 3 started / 4 s from T (the expected ones only)
    assert figures["lateness_s"]["max"] == 4.0
    assert figures["starts_per_second"] == [1, 1, 0, 0, 1]


def test_burst_figures_with_nothing_arrived():
    figures = burst_figures([], jobs=10, due=0.0, paths={f"/hook/{i}" for i in range(10)})
    assert (figures["started"], figures["missing"], figures["starts_per_s"]) == (0, 10, None)


def test_set_flags_name_punctual_settings_only():
    import pytest

    from bench.stack import parse_overrides

    assert parse_overrides(["PUNCTUAL_TARGET_MAX_CONCURRENCY=0", "PUNCTUAL_X=a=b"]) == {
        "PUNCTUAL_TARGET_MAX_CONCURRENCY": "0",
        "PUNCTUAL_X": "a=b",
    }
    for bad in ("PUNCTUAL_X", "OTHER=1"):
        with pytest.raises(SystemExit, match="expected PUNCTUAL_NAME=VALUE"):
            parse_overrides([bad])
