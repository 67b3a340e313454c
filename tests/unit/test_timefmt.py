"""RFC 3339 instants: what is accepted, what is refused, and the one printed form."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.timefmt import (
    format_instant,
    format_local,
    from_micros,
    parse_instant,
    to_micros,
    truncate_to_ms,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-12-01T00:00:00Z", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01t00:00:00z", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01 01:00:00+01:00", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-11-30T19:00:00-05:00", datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-12-01T00:00:00.5Z", datetime(2026, 12, 1, 0, 0, 0, 500000, tzinfo=UTC)),
        ("2026-12-01T00:00:00.123456789Z", datetime(2026, 12, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    ],
)
def test_accepted_forms_become_aware_utc(text, expected):
    parsed = parse_instant(text)
    assert parsed == expected and parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text, reason",
    [
        ("2026-12-01T00:00:00", "offset"),
        ("2026-12-01T00:00", "offset"),
        ("2026-12-01", "RFC 3339"),
        ("2026-02-30T00:00:00Z", "not a valid"),
        ("2026-12-01T24:00:00Z", "not a valid"),
        ("2026-12-01T00:00:00+25:00", "offset"),
        ("0001-01-01T00:00:00+01:00", "range"),
        ("yesterday", "RFC 3339"),
        ("2026-12-01T00:00:00Z\n", "RFC 3339"),  # `$` matched before a final newline
        ("\uff12\uff10\uff12\uff16-12-01T00:00:00Z", "RFC 3339"),  # fullwidth digits: \\d took them
        ("2026-12-01T00:00:00\n", "RFC 3339"),
    ],
)
def test_refused_forms_say_why(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_instant(text)


@pytest.mark.parametrize("value", [None, 1700000000, ["2026-12-01T00:00:00Z"]])
def test_non_strings_are_refused(value):
    with pytest.raises(ValueError):
        parse_instant(value)


def test_the_printed_form_has_a_fraction_only_when_the_instant_has_one():
    assert format_instant(datetime(2026, 12, 1, tzinfo=UTC)) == "2026-12-01T00:00:00Z"
    assert format_instant(datetime(2026, 12, 1, 0, 0, 0, 120000, tzinfo=UTC)) == "2026-12-01T00:00:00.120Z"
    assert format_instant(datetime(2026, 12, 1, 0, 0, 0, 5, tzinfo=UTC)) == "2026-12-01T00:00:00.000005Z"
    berlin = datetime(2026, 12, 1, 1, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert format_instant(berlin) == "2026-12-01T00:00:00Z"
    assert format_instant(datetime(665, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0665-01-02T03:04:05Z"
    with pytest.raises(ValueError):
        format_instant(datetime(2026, 12, 1))


def test_the_two_instants_of_a_fold_print_apart_however_often_each_is_printed():
    # One zone's two 01:30s of a fall-back night compare equal by wall time; the cache
    # of printed instants must still tell them apart.
    new_york = ZoneInfo("America/New_York")
    first = datetime(2026, 11, 1, 1, 30, tzinfo=new_york)
    second = datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=new_york)
    assert first == second  # same tzinfo: compared by wall time
    for _ in range(2):
        assert format_instant(first) == "2026-11-01T05:30:00Z"
        assert format_instant(second) == "2026-11-01T06:30:00Z"


def test_a_refused_text_is_refused_every_time_and_an_accepted_one_reads_the_same():
    for _ in range(2):
        with pytest.raises(ValueError, match="offset"):
            parse_instant("2026-12-01T00:00:00")
        assert parse_instant("2026-12-01T01:00:00+01:00") == datetime(2026, 12, 1, tzinfo=UTC)
        assert parse_instant("2026-12-01T01:00:00+01:00").tzinfo is UTC
    with pytest.raises(ValueError):
        format_instant(datetime(2026, 12, 1))
    with pytest.raises(ValueError):  # a naive twin of a printed instant is still refused
        format_instant(datetime(2026, 12, 1))


def test_local_form_keeps_the_zones_offset():
    berlin = ZoneInfo("Europe/Berlin")
    assert format_local(datetime(2026, 10, 25, 2, 30, tzinfo=berlin)) == "2026-10-25T02:30:00+02:00"
    assert format_local(datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=berlin)) == "2026-10-25T02:30:00+01:00"
    assert format_local(datetime(2026, 6, 1, tzinfo=ZoneInfo("Asia/Kolkata"))) == "2026-06-01T00:00:00+05:30"
    assert (
        format_local(datetime(2026, 6, 1, tzinfo=ZoneInfo("America/St_Johns"))) == "2026-06-01T00:00:00-02:30"
    )


def test_truncate_to_ms():
    moment = datetime(2026, 12, 1, 0, 0, 0, 123999, tzinfo=UTC)
    assert truncate_to_ms(moment) == datetime(2026, 12, 1, 0, 0, 0, 123000, tzinfo=UTC)


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_print_then_parse_is_the_identity(moment):
    assert parse_instant(format_instant(moment)) == moment
    assert parse_instant(format_local(moment.astimezone(timezone(timedelta(hours=-3))))) == moment


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_an_instant_in_microseconds_comes_back_exactly(moment):
    assert from_micros(to_micros(moment)) == moment
    assert to_micros(moment + timedelta(microseconds=1)) == to_micros(moment) + 1


def test_microseconds_count_from_the_unix_epoch():
    assert to_micros(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert to_micros(datetime(2026, 12, 1, 0, 0, 0, 999_999, tzinfo=UTC)) == 1_796_083_200_999_999
    assert from_micros(-1) == datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
