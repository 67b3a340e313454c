"""Schedules: the API form (every bad field at once), bounds, interval grids, one-offs,
first_fire vs next_fire, previews, and the backlog helpers latest_fire/count_fires."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import ValidationError
from app.core.schedules import (
    DstPolicy,
    Schedule,
    count_fires,
    first_fire,
    iter_fires,
    latest_fire,
    next_fire,
    parse_dst,
    parse_schedule,
    preview,
)
from app.core.timefmt import parse_instant

DEFAULT_DST = DstPolicy()


def Z(text: str) -> datetime:
    return parse_instant(text)


def fields_of(exc: pytest.ExceptionInfo) -> list[str]:
    return [error.field for error in exc.value.errors]


# --- parse_schedule --------------------------------------------------------------------


def test_parse_each_kind():
    assert parse_schedule({"run_at": "2026-12-01T01:00:00+01:00"}) == Schedule(
        kind="once", run_at=Z("2026-12-01T00:00:00Z")
    )
    assert parse_schedule({"cron": "0 0 * * *", "timezone": "Europe/Berlin"}) == Schedule(
        kind="cron", cron="0 0 * * *", timezone="Europe/Berlin"
    )
    assert parse_schedule({"cron": "0 0 * * *"}).timezone == "UTC"
    assert parse_schedule(
        {"interval_s": 30, "start_at": "2026-01-01T00:00:00Z", "end_at": "2026-02-01T00:00:00Z"}
    ) == Schedule(
        kind="interval", interval_s=30, start_at=Z("2026-01-01T00:00:00Z"), end_at=Z("2026-02-01T00:00:00Z")
    )


def test_parsed_instants_are_utc():
    schedule = parse_schedule({"cron": "* * * * *", "start_at": "2026-01-01T05:30:00+05:30"})
    assert schedule.start_at == Z("2026-01-01T00:00:00Z")
    assert schedule.start_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "data",
    [
        {"run_at": "2026-12-01T00:00:00Z"},
        {"run_at": "2026-12-01T00:00:00.250Z"},
        {"cron": "*/2 * * * * *", "timezone": "America/New_York"},
        {"cron": "@daily", "timezone": "UTC", "start_at": "2026-01-01T00:00:00Z"},
        {"cron": "0 0 * * *", "timezone": "Asia/Kolkata", "end_at": "2027-01-01T00:00:00Z"},
        {"interval_s": 31_536_000},
        {"interval_s": 1, "start_at": "2026-01-01T00:00:00Z", "end_at": "2026-01-01T00:00:01Z"},
    ],
)
def test_to_json_round_trips_and_is_the_api_form(data):
    schedule = parse_schedule(data)
    assert schedule.to_json() == (
        {**data, "timezone": data.get("timezone", "UTC")} if "cron" in data else data
    )
    assert parse_schedule(schedule.to_json()) == schedule


@pytest.mark.parametrize(
    "data, expected_fields",
    [
        (None, ["schedule"]),
        ("0 0 * * *", ["schedule"]),
        ([], ["schedule"]),
        ({}, ["schedule"]),  # no kind
        ({"timezone": "UTC"}, ["schedule"]),
        ({"cron": "0 0 * * *", "interval_s": 5}, ["schedule"]),  # two kinds
        ({"run_at": "2026-01-01T00:00:00Z", "cron": "0 0 * * *", "interval_s": 5}, ["schedule"]),
        ({"cron": "0 0 * * *", "tz": "UTC"}, ["schedule"]),  # unknown key
        ({"cron": "0 0 * * * * *"}, ["schedule.cron"]),
        ({"cron": "@reboot"}, ["schedule.cron"]),
        ({"cron": "0 0 30 2 *"}, ["schedule.cron"]),  # never fires
        ({"cron": 5}, ["schedule.cron"]),
        ({"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, ["schedule.timezone"]),
        ({"cron": "0 0 * * *", "timezone": "europe/berlin"}, ["schedule.timezone"]),
        ({"cron": "0 0 * * *", "timezone": "localtime"}, ["schedule.timezone"]),
        ({"cron": "0 0 * * *", "timezone": "+01:00"}, ["schedule.timezone"]),
        ({"cron": "0 0 * * *", "timezone": 1}, ["schedule.timezone"]),
        ({"run_at": "2026-12-01T00:00:00"}, ["schedule.run_at"]),  # naive
        ({"run_at": "tomorrow"}, ["schedule.run_at"]),
        ({"run_at": 1767225600}, ["schedule.run_at"]),
        ({"interval_s": 0}, ["schedule.interval_s"]),
        ({"interval_s": -5}, ["schedule.interval_s"]),
        ({"interval_s": 31_536_001}, ["schedule.interval_s"]),
        ({"interval_s": 1.5}, ["schedule.interval_s"]),
        ({"interval_s": "30"}, ["schedule.interval_s"]),
        ({"interval_s": True}, ["schedule.interval_s"]),
        ({"interval_s": 5, "start_at": "2026-01-01"}, ["schedule.start_at"]),
        ({"interval_s": 5, "end_at": "2026-01-01T00:00:00"}, ["schedule.end_at"]),
        (
            {"interval_s": 5, "start_at": "2026-01-02T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"},
            ["schedule.end_at"],
        ),
        (
            {"interval_s": 5, "start_at": "2026-01-01T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"},
            ["schedule.end_at"],
        ),
        ({"interval_s": 5, "timezone": "Europe/Berlin"}, ["schedule.timezone"]),  # intervals ignore zones
        ({"run_at": "2026-01-01T00:00:00Z", "start_at": "2026-01-01T00:00:00Z"}, ["schedule.start_at"]),
        ({"run_at": "2026-01-01T00:00:00Z", "end_at": "2026-01-01T00:00:00Z"}, ["schedule.end_at"]),
    ],
)
def test_invalid_schedules_name_the_field(data, expected_fields):
    with pytest.raises(ValidationError) as info:
        parse_schedule(data)
    assert fields_of(info) == expected_fields
    assert all(error.message for error in info.value.errors)


def test_every_bad_sub_field_is_reported_at_once():
    with pytest.raises(ValidationError) as info:
        parse_schedule({"cron": "61 * * * *", "timezone": "Nowhere/City", "start_at": "x", "end_at": "y"})
    assert fields_of(info) == ["schedule.cron", "schedule.timezone", "schedule.start_at", "schedule.end_at"]


def test_bad_values_are_reported_even_beside_a_kind_error():
    with pytest.raises(ValidationError) as info:
        parse_schedule({"cron": "nope", "interval_s": 0, "colour": "red"})
    assert sorted(fields_of(info)) == ["schedule", "schedule", "schedule.cron", "schedule.interval_s"]


def test_custom_field_prefix():
    with pytest.raises(ValidationError) as info:
        parse_schedule({"interval_s": 0}, field="body.schedule")
    assert fields_of(info) == ["body.schedule.interval_s"]


def test_null_optional_fields_mean_absent():
    assert parse_schedule(
        {"cron": "0 0 * * *", "timezone": None, "start_at": None, "end_at": None}
    ) == Schedule(kind="cron", cron="0 0 * * *")


def test_whole_float_interval_is_accepted_as_int():
    schedule = parse_schedule({"interval_s": 30.0})
    assert schedule.interval_s == 30 and isinstance(schedule.interval_s, int)


# --- parse_dst -------------------------------------------------------------------------


def test_parse_dst_defaults_and_values():
    assert parse_dst(None) == DstPolicy("shift", "once")
    assert parse_dst({}) == DstPolicy("shift", "once")
    assert parse_dst({"gap": "skip"}) == DstPolicy("skip", "once")
    assert parse_dst({"gap": "shift", "overlap": "twice"}) == DstPolicy("shift", "twice")
    assert DstPolicy("skip", "twice").to_json() == {"gap": "skip", "overlap": "twice"}
    assert parse_dst(DstPolicy("skip", "twice").to_json()) == DstPolicy("skip", "twice")


@pytest.mark.parametrize(
    "data, expected_fields",
    [
        ("shift", ["dst"]),
        ({"gap": "jump"}, ["dst.gap"]),
        ({"overlap": "both"}, ["dst.overlap"]),
        ({"gap": 1, "overlap": True}, ["dst.gap", "dst.overlap"]),
        ({"gap": "skip", "fold": 1}, ["dst"]),
    ],
)
def test_parse_dst_errors(data, expected_fields):
    with pytest.raises(ValidationError) as info:
        parse_dst(data)
    assert fields_of(info) == expected_fields


# --- one-off -------------------------------------------------------------------------

ONE_OFF = Schedule(kind="once", run_at=Z("2026-06-01T12:00:00Z"))


def test_one_off_next_fire():
    anchor = Z("2026-01-01T00:00:00Z")
    assert next_fire(ONE_OFF, DEFAULT_DST, Z("2026-06-01T11:59:59.999999Z"), anchor) == Z(
        "2026-06-01T12:00:00Z"
    )
    assert next_fire(ONE_OFF, DEFAULT_DST, Z("2026-06-01T12:00:00Z"), anchor) is None  # strictly after
    assert next_fire(ONE_OFF, DEFAULT_DST, Z("2026-07-01T00:00:00Z"), anchor) is None


def test_one_off_first_fire_keeps_a_past_run_at():
    # Created after its run_at: it fires at once, so first_fire is the run_at itself.
    assert first_fire(ONE_OFF, DEFAULT_DST, Z("2026-07-01T00:00:00Z"), Z("2026-07-01T00:00:00Z")) == Z(
        "2026-06-01T12:00:00Z"
    )
    assert first_fire(ONE_OFF, DEFAULT_DST, Z("2026-05-01T00:00:00Z"), Z("2026-05-01T00:00:00Z")) == Z(
        "2026-06-01T12:00:00Z"
    )


def test_one_off_preview():
    items = preview(ONE_OFF, DEFAULT_DST, Z("2026-01-01T00:00:00Z"), 10)
    assert [(i.at, i.dst) for i in items] == [(Z("2026-06-01T12:00:00Z"), None)]


# --- interval grids --------------------------------------------------------------------


def test_interval_grid_without_start_at_starts_one_interval_after_creation():
    # Created 10:00:00.250; interval 90 s: 10:01:30.250, 10:03:00.250, 10:04:30.250, ...
    created = Z("2026-05-01T10:00:00.250Z")
    schedule = Schedule(kind="interval", interval_s=90)
    assert first_fire(schedule, DEFAULT_DST, created, created) == Z("2026-05-01T10:01:30.250Z")
    assert next_fire(schedule, DEFAULT_DST, created, created) == Z("2026-05-01T10:01:30.250Z")
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T10:05:00Z"), created) == Z(
        "2026-05-01T10:06:00.250Z"
    )
    # From a grid point: the next grid point (no drift from `after`).
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T10:03:00.250Z"), created) == Z(
        "2026-05-01T10:04:30.250Z"
    )
    # Before creation: never the creation instant itself (k >= 1).
    assert next_fire(schedule, DEFAULT_DST, Z("2026-04-01T00:00:00Z"), created) == Z(
        "2026-05-01T10:01:30.250Z"
    )


def test_interval_first_fire_after_a_patch_stays_on_the_creation_grid():
    created = Z("2026-05-01T10:00:00Z")
    schedule = Schedule(kind="interval", interval_s=3600)
    # Re-scheduled at 13:20: the grid is 11:00, 12:00, ... from creation -> 14:00.
    assert first_fire(schedule, DEFAULT_DST, Z("2026-05-01T13:20:00Z"), created) == Z("2026-05-01T14:00:00Z")


def test_interval_grid_with_start_at_includes_start_at():
    created = Z("2026-05-01T09:17:00Z")
    schedule = Schedule(kind="interval", interval_s=3600, start_at=Z("2026-05-01T12:00:00Z"))
    assert first_fire(schedule, DEFAULT_DST, created, created) == Z("2026-05-01T12:00:00Z")  # k = 0
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T12:00:00Z"), created) == Z("2026-05-01T13:00:00Z")
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T12:30:00Z"), created) == Z("2026-05-01T13:00:00Z")
    # Created after start_at: the grid still comes from start_at, not from creation.
    assert first_fire(schedule, DEFAULT_DST, Z("2026-05-01T15:45:00Z"), Z("2026-05-01T15:45:00Z")) == Z(
        "2026-05-01T16:00:00Z"
    )


def test_interval_ignores_dst():
    # 1 h across Berlin's spring gap in a zone-less interval: exactly 3600 s apart.
    start = Z("2026-03-29T00:00:00Z")
    schedule = Schedule(kind="interval", interval_s=3600, start_at=start)
    got = list(
        zip(range(4), iter_fires(schedule, DEFAULT_DST, start - timedelta(seconds=1), start), strict=False)
    )
    assert [t for _, t in got] == [start + timedelta(hours=k) for k in range(4)]


def test_interval_end_at_is_inclusive():
    schedule = Schedule(
        kind="interval", interval_s=60, start_at=Z("2026-05-01T00:00:00Z"), end_at=Z("2026-05-01T00:02:00Z")
    )
    anchor = Z("2026-04-01T00:00:00Z")
    assert list(iter_fires(schedule, DEFAULT_DST, anchor, anchor)) == [
        Z("2026-05-01T00:00:00Z"),
        Z("2026-05-01T00:01:00Z"),
        Z("2026-05-01T00:02:00Z"),
    ]
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T00:02:00Z"), anchor) is None
    assert first_fire(schedule, DEFAULT_DST, Z("2026-06-01T00:00:00Z"), anchor) is None


# --- cron bounds ------------------------------------------------------------------------


def test_cron_start_and_end_bounds_are_inclusive():
    schedule = Schedule(
        kind="cron", cron="0 * * * *", start_at=Z("2026-05-01T11:00:00Z"), end_at=Z("2026-05-01T13:00:00Z")
    )
    anchor = Z("2026-05-01T00:00:00Z")
    assert list(iter_fires(schedule, DEFAULT_DST, anchor, anchor)) == [
        Z("2026-05-01T11:00:00Z"),
        Z("2026-05-01T12:00:00Z"),
        Z("2026-05-01T13:00:00Z"),
    ]
    assert first_fire(schedule, DEFAULT_DST, anchor, anchor) == Z("2026-05-01T11:00:00Z")
    assert first_fire(schedule, DEFAULT_DST, Z("2026-05-01T11:00:00Z"), anchor) == Z(
        "2026-05-01T12:00:00Z"
    )  # > now
    assert next_fire(schedule, DEFAULT_DST, Z("2026-05-01T13:00:00Z"), anchor) is None


def test_cron_start_at_between_occurrences():
    schedule = Schedule(kind="cron", cron="0 * * * *", start_at=Z("2026-05-01T10:30:00Z"))
    anchor = Z("2026-05-01T00:00:00Z")
    assert first_fire(schedule, DEFAULT_DST, anchor, anchor) == Z("2026-05-01T11:00:00Z")


def test_cron_bounds_apply_to_the_shifted_instant():
    # Berlin "30 2 * * *" shifts to 01:00Z on 2026-03-29; an end_at of 00:59:59Z excludes it.
    schedule = Schedule(
        kind="cron", cron="30 2 * * *", timezone="Europe/Berlin", end_at=Z("2026-03-29T00:59:59Z")
    )
    assert next_fire(schedule, DEFAULT_DST, Z("2026-03-28T12:00:00Z"), Z("2026-01-01T00:00:00Z")) is None


# --- preview -------------------------------------------------------------------------------


def test_interval_preview_without_start_at_counts_from_after():
    schedule = Schedule(kind="interval", interval_s=30)
    items = preview(schedule, DEFAULT_DST, Z("2026-05-01T00:00:10Z"), 3)
    assert [i.at for i in items] == [
        Z("2026-05-01T00:00:40Z"),
        Z("2026-05-01T00:01:10Z"),
        Z("2026-05-01T00:01:40Z"),
    ]
    assert [i.dst for i in items] == [None, None, None]
    assert items[0].local.utcoffset() == timedelta(0)


def test_interval_preview_with_start_at_uses_its_grid():
    schedule = Schedule(kind="interval", interval_s=30, start_at=Z("2026-05-01T00:00:00Z"))
    assert [i.at for i in preview(schedule, DEFAULT_DST, Z("2026-05-01T00:00:10Z"), 2)] == [
        Z("2026-05-01T00:00:30Z"),
        Z("2026-05-01T00:01:00Z"),
    ]
    # `after` before start_at: the grid begins at start_at itself.
    assert [i.at for i in preview(schedule, DEFAULT_DST, Z("2026-04-01T00:00:00Z"), 2)] == [
        Z("2026-05-01T00:00:00Z"),
        Z("2026-05-01T00:00:30Z"),
    ]


def test_interval_preview_in_a_zone_flags_local_times_that_occur_twice():
    # Every 30 min in Berlin's autumn overlap: 00:30Z is 02:30 CEST, 01:30Z is 02:30 CET.
    schedule = Schedule(kind="interval", interval_s=1800, timezone="Europe/Berlin")
    items = preview(schedule, DEFAULT_DST, Z("2026-10-25T00:15:00Z"), 4)
    assert [(i.at, i.local.isoformat(), i.dst) for i in items] == [
        (Z("2026-10-25T00:45:00Z"), "2026-10-25T02:45:00+02:00", "overlap_first"),
        (Z("2026-10-25T01:15:00Z"), "2026-10-25T02:15:00+01:00", "overlap_second"),
        (Z("2026-10-25T01:45:00Z"), "2026-10-25T02:45:00+01:00", "overlap_second"),
        (Z("2026-10-25T02:15:00Z"), "2026-10-25T03:15:00+01:00", None),
    ]


def test_preview_count_and_end():
    schedule = Schedule(kind="cron", cron="0 0 * * *", end_at=Z("2026-05-03T00:00:00Z"))
    assert len(preview(schedule, DEFAULT_DST, Z("2026-05-01T00:00:00Z"), 100)) == 2
    assert preview(schedule, DEFAULT_DST, Z("2026-05-01T00:00:00Z"), 0) == []
    assert (
        len(preview(Schedule(kind="cron", cron="* * * * *"), DEFAULT_DST, Z("2026-05-01T00:00:00Z"), 100))
        == 100
    )


def test_preview_local_is_in_the_schedule_zone():
    items = preview(
        Schedule(kind="cron", cron="0 9 * * *", timezone="America/New_York"),
        DEFAULT_DST,
        Z("2026-07-01T00:00:00Z"),
        1,
    )
    assert items[0].at == Z("2026-07-01T13:00:00Z")  # 09:00 EDT (-04)
    assert items[0].local.isoformat() == "2026-07-01T09:00:00-04:00"


# --- latest_fire / count_fires -------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(kind="interval", interval_s=7, start_at=Z("2026-05-01T00:00:03Z")),
        Schedule(kind="interval", interval_s=3600),
        Schedule(kind="cron", cron="*/7 * * * * *"),
        Schedule(kind="cron", cron="*/15 * * * *", timezone="Europe/Berlin"),
        Schedule(kind="cron", cron="30 2 * * *", timezone="Europe/Berlin"),
        Schedule(kind="cron", cron="*/30 * * * *", timezone="Europe/Berlin"),
        Schedule(kind="once", run_at=Z("2026-05-01T12:00:00Z")),
    ],
)
@pytest.mark.parametrize("dst", [DstPolicy("shift", "twice"), DstPolicy("skip", "once")])
def test_latest_and_count_agree_with_a_walk(schedule, dst):
    anchor = Z("2026-05-01T00:00:00.5Z")
    for since, until in [
        ("2026-05-01T00:00:00Z", "2026-05-01T03:00:00Z"),
        ("2026-05-01T00:00:00Z", "2026-05-01T00:00:00.4Z"),
        ("2026-03-28T22:00:00Z", "2026-03-29T03:10:00Z"),
        ("2026-10-24T23:00:00Z", "2026-10-25T01:45:00Z"),
        ("2026-05-01T12:00:00Z", "2026-05-01T12:00:00Z"),
    ]:
        walk = []
        for t in iter_fires(schedule, dst, Z(since), anchor):
            if t > Z(until) or len(walk) > 5000:
                break
            walk.append(t)
        assert latest_fire(schedule, dst, anchor, Z(since), Z(until)) == (walk[-1] if walk else None), (
            since,
            until,
        )
        count = count_fires(schedule, dst, anchor, Z(since), Z(until))
        if schedule.kind == "cron" and Z(until) > Z(since):
            assert count is None  # only a walk could tell
        else:
            assert count == len(walk)


def test_latest_fire_on_a_week_of_seconds_is_a_search_not_a_walk():
    # 604,800 occurrences lie in the window; a walk would take seconds, the search ~ms.
    schedule = Schedule(kind="cron", cron="* * * * * *", timezone="Europe/Berlin")
    since, until = Z("2026-03-25T00:00:00Z"), Z("2026-04-01T00:00:00.5Z")
    import time

    started = time.perf_counter()
    assert latest_fire(schedule, DEFAULT_DST, since, since, until) == Z("2026-04-01T00:00:00Z")
    assert time.perf_counter() - started < 1.0


@settings(max_examples=100, deadline=None)
@given(
    interval_s=st.integers(1, 100_000),
    start_offset_us=st.integers(0, 10**12),
    after_offset_us=st.integers(-(10**12), 10**13),
)
def test_property_interval_next_fire_is_on_the_grid(interval_s, start_offset_us, after_offset_us):
    base = Z("2026-01-01T00:00:00Z")
    anchor = base + timedelta(microseconds=start_offset_us)
    after = base + timedelta(microseconds=after_offset_us)
    schedule = Schedule(kind="interval", interval_s=interval_s)
    t = next_fire(schedule, DEFAULT_DST, after, anchor)
    step = timedelta(seconds=interval_s)
    k, rest = divmod(t - anchor, step)
    assert rest == timedelta(0) and k >= 1
    assert t > after and (t - step <= after or k == 1)
    assert next_fire(schedule, DEFAULT_DST, t, anchor) == t + step


def test_naive_instants_are_refused_not_read_as_host_time():
    schedule = Schedule(kind="cron", cron="0 0 * * *", timezone="Europe/Berlin")
    with pytest.raises(ValueError):
        next_fire(schedule, DEFAULT_DST, datetime(2026, 5, 1), Z("2026-05-01T00:00:00Z"))
    with pytest.raises(ValueError):
        next_fire(
            Schedule(kind="interval", interval_s=5),
            DEFAULT_DST,
            Z("2026-05-01T00:00:00Z"),
            datetime(2026, 5, 1),
        )


def test_occurrences_past_year_9999_mean_none_remains():
    late = Z("9999-12-31T23:00:00Z")
    assert next_fire(Schedule(kind="interval", interval_s=31_536_000), DEFAULT_DST, late, late) is None
    assert (
        next_fire(
            Schedule(kind="cron", cron="0 0 1 1 *", timezone="Pacific/Kiritimati"), DEFAULT_DST, late, late
        )
        is None
    )
    assert (
        next_fire(Schedule(kind="cron", cron="59 23 * * *", timezone="Etc/GMT+12"), DEFAULT_DST, late, late)
        is None
    )
