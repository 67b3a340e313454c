"""Cron expressions and DST: which expressions are valid, and when they fire.

Every expected instant below is derived by hand from the zone's rules (written next
to it), never computed with the code under test. The hypothesis properties at the
end check the resolution against an independent brute-force oracle.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.cron import parse_cron
from app.core.schedules import DstPolicy, Schedule, next_fire, preview
from app.core.timefmt import parse_instant

SHIFT_ONCE = DstPolicy(gap="shift", overlap="once")
SHIFT_TWICE = DstPolicy(gap="shift", overlap="twice")
SKIP_ONCE = DstPolicy(gap="skip", overlap="once")
ANCHOR = parse_instant("2026-01-01T00:00:00Z")  # irrelevant to cron, required by the API


def Z(text: str) -> datetime:
    return parse_instant(text)


def cron(expr: str, tz: str = "UTC", **bounds) -> Schedule:
    return Schedule(kind="cron", cron=expr, timezone=tz, **bounds)


def fires(schedule: Schedule, dst: DstPolicy, after: str, n: int) -> list[str]:
    """The next n occurrences by repeated next_fire, as UTC text."""
    out, t = [], Z(after)
    for _ in range(n):
        t = next_fire(schedule, dst, t, ANCHOR)
        if t is None:
            break
        out.append(t.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return out


def flags(schedule: Schedule, dst: DstPolicy, after: str, n: int) -> list[tuple[str, str, str | None]]:
    return [
        (i.at.strftime("%Y-%m-%dT%H:%M:%SZ"), i.local.isoformat(), i.dst)
        for i in preview(schedule, dst, Z(after), n)
    ]


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 * * *",
        "*/15 * * * *",
        "0 9-17 * * mon-fri",
        "0 0 1,15 * *",
        "30 2 * mar,oct sun",
        "0 0 * * 7",  # Sunday, as 0
        "0 0 29 2 *",  # fires only in leap years, but fires
        "0-59/7 * * * *",
        "*/2 * * * * *",  # 6 fields, seconds first
        "30 0 9 * * *",
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "@midnight",
        "@DAILY",
        "  0 0 * * *  ",
    ],
)
def test_valid_expressions_are_accepted(expr):
    assert parse_cron(expr).text == expr


@pytest.mark.parametrize(
    "expr, words",
    [
        ("", "5 fields"),
        ("* * * *", "5 fields"),
        ("* * * * * * *", "not 7"),  # croniter takes a year field; standard cron does not
        ("@reboot", "unknown alias"),  # croniter does not run it either, but say so clearly
        ("@every 5m", "unknown alias"),
        ("60 * * * *", "out of range"),
        ("0 24 * * *", "out of range"),
        ("0 0 0 * *", "out of range"),
        ("0 0 32 * *", "out of range"),
        ("0 0 * 13 *", "out of range"),
        ("0 0 * * 8", "out of range"),
        ("60 * * * * *", "second field"),
        ("*/0 * * * *", "at least 1"),
        ("5/15 * * * *", "needs '*' or a range"),  # Quartz-only form
        ("30-10 * * * *", "backwards"),  # croniter wraps it around
        ("0 0 L * *", "not a valid value"),  # Quartz "last day"
        ("0 0 15W * *", "not a valid value"),
        ("0 0 * * 1#2", "not a number"),
        ("0 0 ? * *", "not a number"),
        ("H * * * *", "not a valid value"),  # croniter's hashed form needs a hash id
        ("R * * * *", "not a valid value"),  # croniter's random form is not deterministic
        ("0 0 * jan-foo *", "not a valid value"),
        ("0 0 * * mon-bogus", "not a valid value"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0\u00a00 * * *", "5 fields"),  # a no-break space is not a separator
        ("5\n,6 * * * *", "not a number"),  # `$` would have let "5\n" pass as an item
        ("0 0 * * 1\n", None),  # a final newline is stripped as surrounding whitespace
        ("0 " * 129 + "0", "at most 256 characters"),
        (",".join(["1"] * 20_000) + " * * * *", "at most 256 characters"),
        (",".join(["1"] * 61) + " * * * *", "at most 60 comma-separated items, not 61"),
    ],
)
def test_invalid_expressions_are_rejected_with_a_reason(expr, words):
    if words is None:
        assert parse_cron(expr).croniter_form == "0 0 * * 1"
        return
    with pytest.raises(ValueError) as info:
        parse_cron(expr)
    assert words in str(info.value)


def test_a_list_of_sixty_items_in_256_characters_is_accepted():
    every = ",".join(str(n) for n in range(60))
    assert len(every) <= 256 and parse_cron(f"{every} * * * *").text.startswith("0,1,2")


def test_non_strings_are_rejected():
    for value in (None, 5, ["0", "0", "*", "*", "*"]):
        with pytest.raises(ValueError):
            parse_cron(value)


def test_six_fields_put_seconds_first_and_croniter_gets_seconds_last():
    assert parse_cron("5 0 9 * * *").croniter_form == "0 9 * * * 5"
    assert parse_cron("5 0 9 * * *").has_seconds
    assert not parse_cron("0 9 * * *").has_seconds


# --- 6-field crons -------------------------------------------------------------------


def test_six_field_every_two_seconds():
    assert fires(cron("*/2 * * * * *"), SHIFT_ONCE, "2026-05-01T12:00:00Z", 3) == [
        "2026-05-01T12:00:02Z",
        "2026-05-01T12:00:04Z",
        "2026-05-01T12:00:06Z",
    ]


def test_six_field_seconds_first_at_nine_oh_oh_thirty():
    # "30 0 9 * * *" = second 30, minute 0, hour 9; read seconds-last it would mean
    # minute 30 of hour 0 on the 9th.
    assert fires(cron("30 0 9 * * *"), SHIFT_ONCE, "2026-05-01T00:00:00Z", 2) == [
        "2026-05-01T09:00:30Z",
        "2026-05-02T09:00:30Z",
    ]


def test_six_field_after_a_fractional_instant():
    assert fires(cron("*/2 * * * * *"), SHIFT_ONCE, "2026-05-01T12:00:01.999Z", 1) == ["2026-05-01T12:00:02Z"]
    assert fires(cron("*/2 * * * * *"), SHIFT_ONCE, "2026-05-01T12:00:02.001Z", 1) == ["2026-05-01T12:00:04Z"]


# --- Europe/Berlin -------------------------------------------------------------------
# 2026-03-29: 02:00 CET (+01) jumps to 03:00 CEST (+02) at 01:00Z.
# 2026-10-25: 03:00 CEST (+02) falls back to 02:00 CET (+01) at 01:00Z; 02:00-02:59 twice.


def test_spring_gap_berlin_shift_runs_at_the_transition_instant():
    # 03-28 02:30 CET = 01:30Z; 03-29 02:30 does not exist -> 01:00Z (03:00 CEST);
    # 03-30 02:30 CEST = 00:30Z.
    assert fires(cron("30 2 * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-03-28T00:00:00Z", 3) == [
        "2026-03-28T01:30:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-30T00:30:00Z",
    ]


def test_spring_gap_berlin_skip_drops_the_missing_day():
    assert fires(cron("30 2 * * *", "Europe/Berlin"), SKIP_ONCE, "2026-03-28T00:00:00Z", 2) == [
        "2026-03-28T01:30:00Z",
        "2026-03-30T00:30:00Z",
    ]


def test_spring_gap_every_15_minutes_merges_into_one_occurrence():
    # 01:45 CET = 00:45Z. 02:00, 02:15, 02:30, 02:45 all shift to 01:00Z, which is also
    # the regular 03:00 CEST occurrence: ONE run at 01:00Z. Then 03:15 CEST = 01:15Z.
    schedule = cron("*/15 * * * *", "Europe/Berlin")
    assert fires(schedule, SHIFT_ONCE, "2026-03-29T00:40:00Z", 3) == [
        "2026-03-29T00:45:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-29T01:15:00Z",
    ]
    assert flags(schedule, SHIFT_ONCE, "2026-03-29T00:40:00Z", 3) == [
        ("2026-03-29T00:45:00Z", "2026-03-29T01:45:00+01:00", None),
        ("2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00", "gap_shifted"),
        ("2026-03-29T01:15:00Z", "2026-03-29T03:15:00+02:00", None),
    ]


def test_spring_gap_every_15_minutes_skip_keeps_only_the_regular_three_oclock():
    assert flags(cron("*/15 * * * *", "Europe/Berlin"), SKIP_ONCE, "2026-03-29T00:40:00Z", 3) == [
        ("2026-03-29T00:45:00Z", "2026-03-29T01:45:00+01:00", None),
        ("2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00", None),
        ("2026-03-29T01:15:00Z", "2026-03-29T03:15:00+02:00", None),
    ]


def test_spring_gap_every_second_jumps_the_gap():
    # 6-field, every second: 3,600 wall-clock seconds 02:00:00-02:59:59 do not exist;
    # they and 03:00:00 become the single instant 01:00:00Z.
    assert fires(cron("* * * * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-03-29T00:59:58Z", 3) == [
        "2026-03-29T00:59:59Z",
        "2026-03-29T01:00:00Z",
        "2026-03-29T01:00:01Z",
    ]


def test_spring_gap_after_the_transition_instant_is_not_repeated():
    assert fires(cron("30 2 * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-03-29T01:00:00Z", 1) == [
        "2026-03-30T00:30:00Z",
    ]


def test_autumn_overlap_berlin_once_runs_the_first_instant():
    # 10-24 02:30 CEST = 00:30Z; 10-25 02:30 CEST = 00:30Z (first); 10-26 02:30 CET = 01:30Z.
    assert fires(cron("30 2 * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-10-24T00:00:00Z", 3) == [
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",
        "2026-10-26T01:30:00Z",
    ]


def test_autumn_overlap_berlin_twice_runs_both_instants():
    # 10-25 02:30 CEST = 00:30Z and 02:30 CET = 01:30Z.
    assert fires(cron("30 2 * * *", "Europe/Berlin"), SHIFT_TWICE, "2026-10-24T12:00:00Z", 3) == [
        "2026-10-25T00:30:00Z",
        "2026-10-25T01:30:00Z",
        "2026-10-26T01:30:00Z",
    ]


def test_autumn_overlap_every_30_minutes_twice_is_in_utc_order():
    # Wall-clock order would be 02:00a 02:00b 02:30a 02:30b; UTC order interleaves them:
    # 02:00 CEST 00:00Z, 02:30 CEST 00:30Z, 02:00 CET 01:00Z, 02:30 CET 01:30Z, 03:00 CET 02:00Z.
    assert flags(cron("*/30 * * * *", "Europe/Berlin"), SHIFT_TWICE, "2026-10-24T23:45:00Z", 5) == [
        ("2026-10-25T00:00:00Z", "2026-10-25T02:00:00+02:00", "overlap_first"),
        ("2026-10-25T00:30:00Z", "2026-10-25T02:30:00+02:00", "overlap_first"),
        ("2026-10-25T01:00:00Z", "2026-10-25T02:00:00+01:00", "overlap_second"),
        ("2026-10-25T01:30:00Z", "2026-10-25T02:30:00+01:00", "overlap_second"),
        ("2026-10-25T02:00:00Z", "2026-10-25T03:00:00+01:00", None),
    ]


def test_autumn_overlap_every_30_minutes_once_flags_the_first_pass():
    assert flags(cron("*/30 * * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-10-24T23:45:00Z", 3) == [
        ("2026-10-25T00:00:00Z", "2026-10-25T02:00:00+02:00", "overlap_first"),
        ("2026-10-25T00:30:00Z", "2026-10-25T02:30:00+02:00", "overlap_first"),
        ("2026-10-25T02:00:00Z", "2026-10-25T03:00:00+01:00", None),
    ]


def test_autumn_overlap_twice_from_inside_the_first_pass():
    # after = 00:45Z (02:45 CEST, first pass): the second pass of 02:00 and 02:30 lies ahead.
    assert fires(cron("*/30 * * * *", "Europe/Berlin"), SHIFT_TWICE, "2026-10-25T00:45:00Z", 3) == [
        "2026-10-25T01:00:00Z",
        "2026-10-25T01:30:00Z",
        "2026-10-25T02:00:00Z",
    ]


def test_autumn_overlap_twice_from_inside_the_second_pass():
    # after = 01:15Z (02:15 CET, second pass): 02:30 CET = 01:30Z is next.
    assert fires(cron("*/30 * * * *", "Europe/Berlin"), SHIFT_TWICE, "2026-10-25T01:15:00Z", 2) == [
        "2026-10-25T01:30:00Z",
        "2026-10-25T02:00:00Z",
    ]


def test_autumn_overlap_once_from_inside_the_second_pass_waits_for_three_oclock():
    assert fires(cron("*/30 * * * *", "Europe/Berlin"), SHIFT_ONCE, "2026-10-25T01:15:00Z", 1) == [
        "2026-10-25T02:00:00Z",
    ]


# --- America/New_York ----------------------------------------------------------------
# 2026-03-08: 02:00 EST (-05) jumps to 03:00 EDT (-04) at 07:00Z.
# 2026-11-01: 02:00 EDT (-04) falls back to 01:00 EST (-05) at 06:00Z; 01:00-01:59 twice.


def test_spring_gap_new_york():
    # 03-07 02:30 EST = 07:30Z; 03-08 shifted to 07:00Z (03:00 EDT); 03-09 02:30 EDT = 06:30Z.
    schedule = cron("30 2 * * *", "America/New_York")
    assert fires(schedule, SHIFT_ONCE, "2026-03-07T00:00:00Z", 3) == [
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
    ]
    assert fires(schedule, SKIP_ONCE, "2026-03-07T00:00:00Z", 2) == [
        "2026-03-07T07:30:00Z",
        "2026-03-09T06:30:00Z",
    ]
    assert flags(schedule, SHIFT_ONCE, "2026-03-08T00:00:00Z", 1) == [
        ("2026-03-08T07:00:00Z", "2026-03-08T03:00:00-04:00", "gap_shifted"),
    ]


def test_autumn_overlap_new_york():
    # 10-31 01:30 EDT = 05:30Z; 11-01 01:30 EDT = 05:30Z and 01:30 EST = 06:30Z;
    # 11-02 01:30 EST = 06:30Z.
    schedule = cron("30 1 * * *", "America/New_York")
    assert fires(schedule, SHIFT_ONCE, "2026-10-31T00:00:00Z", 3) == [
        "2026-10-31T05:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]
    assert flags(schedule, SHIFT_TWICE, "2026-10-31T12:00:00Z", 3) == [
        ("2026-11-01T05:30:00Z", "2026-11-01T01:30:00-04:00", "overlap_first"),
        ("2026-11-01T06:30:00Z", "2026-11-01T01:30:00-05:00", "overlap_second"),
        ("2026-11-02T06:30:00Z", "2026-11-02T01:30:00-05:00", None),
    ]


# --- Australia/Lord_Howe: a 30-minute shift ----------------------------------------
# Standard +10:30, summer +11:00.
# 2026-04-05 (first Sunday of April): 02:00 +11 falls back to 01:30 +10:30 at
#   2026-04-04T15:00Z; 01:30-01:59 happens twice.
# 2026-10-04 (first Sunday of October): 02:00 +10:30 jumps to 02:30 +11 at
#   2026-10-03T15:30Z; 02:00-02:29 does not exist.


def test_autumn_overlap_lord_howe_half_hour():
    # 04-05 01:45 +11 = 04-04 14:45Z and 01:45 +10:30 = 04-04 15:15Z;
    # 04-06 01:45 +10:30 = 04-05 15:15Z.
    schedule = cron("45 1 * * *", "Australia/Lord_Howe")
    assert flags(schedule, SHIFT_TWICE, "2026-04-04T00:00:00Z", 3) == [
        ("2026-04-04T14:45:00Z", "2026-04-05T01:45:00+11:00", "overlap_first"),
        ("2026-04-04T15:15:00Z", "2026-04-05T01:45:00+10:30", "overlap_second"),
        ("2026-04-05T15:15:00Z", "2026-04-06T01:45:00+10:30", None),
    ]
    assert fires(schedule, SHIFT_ONCE, "2026-04-04T00:00:00Z", 2) == [
        "2026-04-04T14:45:00Z",
        "2026-04-05T15:15:00Z",
    ]


def test_spring_gap_lord_howe_half_hour():
    # 10-03 02:15 +10:30 = 10-02 15:45Z; 10-04 02:15 does not exist -> 10-03 15:30Z
    # (02:30 +11); 10-05 02:15 +11 = 10-04 15:15Z.
    schedule = cron("15 2 * * *", "Australia/Lord_Howe")
    assert fires(schedule, SHIFT_ONCE, "2026-10-02T00:00:00Z", 3) == [
        "2026-10-02T15:45:00Z",
        "2026-10-03T15:30:00Z",
        "2026-10-04T15:15:00Z",
    ]
    assert fires(schedule, SKIP_ONCE, "2026-10-02T00:00:00Z", 2) == [
        "2026-10-02T15:45:00Z",
        "2026-10-04T15:15:00Z",
    ]
    assert flags(schedule, SHIFT_ONCE, "2026-10-03T00:00:00Z", 1) == [
        ("2026-10-03T15:30:00Z", "2026-10-04T02:30:00+11:00", "gap_shifted"),
    ]


def test_spring_gap_lord_howe_wall_clock_after_the_half_hour_gap_is_unaffected():
    # 02:30 exists (it is the first time after the gap): 02:30 +11 = 10-03 15:30Z, no flag.
    assert flags(cron("30 2 * * *", "Australia/Lord_Howe"), SHIFT_ONCE, "2026-10-03T00:00:00Z", 1) == [
        ("2026-10-03T15:30:00Z", "2026-10-04T02:30:00+11:00", None),
    ]


# --- Asia/Kolkata: no DST ------------------------------------------------------------


def test_no_dst_kolkata_is_a_fixed_offset_all_year():
    # +05:30 all year: 09:00 IST = 03:30Z, including on Europe's and America's DST days.
    schedule = cron("0 9 * * *", "Asia/Kolkata")
    for day in ("2026-03-07", "2026-03-28", "2026-10-24", "2026-10-31"):
        items = preview(schedule, SHIFT_TWICE, Z(f"{day}T00:00:00Z"), 2)
        assert [i.at.strftime("%H:%M") for i in items] == ["03:30", "03:30"]
        assert [i.dst for i in items] == [None, None]
        assert items[1].at - items[0].at == timedelta(days=1)


def test_utc_default_zone():
    assert fires(cron("0 0 * * *"), SHIFT_ONCE, "2026-03-29T00:00:00Z", 2) == [
        "2026-03-30T00:00:00Z",
        "2026-03-31T00:00:00Z",
    ]


# --- hypothesis: properties over DST zones and generated expressions ----------------

DST_ZONES = [
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",  # Dublin: "negative" DST in tzdb
    "America/New_York",
    "America/Santiago",
    "America/Havana",  # Havana changes at midnight
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "Pacific/Chatham",  # Chatham: +12:45/+13:45
    "Antarctica/Troll",  # a two-hour shift
    "Asia/Kolkata",
    "UTC",
]

# Each option: (cron text, the set of values it means). The oracle reads the sets,
# never croniter, so the two can disagree.
MINUTES = [
    ("*", set(range(60))),
    ("0", {0}),
    ("30", {30}),
    ("*/15", {0, 15, 30, 45}),
    ("0,30", {0, 30}),
    ("5-50/15", {5, 20, 35, 50}),
    ("59", {59}),
    ("10-12", {10, 11, 12}),
]
HOURS = [
    ("*", set(range(24))),
    ("0", {0}),
    ("1", {1}),
    ("2", {2}),
    ("3", {3}),
    ("1-3", {1, 2, 3}),
    ("*/2", set(range(0, 24, 2))),
    ("0,2,23", {0, 2, 23}),
]
DAYS_OF_MONTH = [("*", None), ("1", {1}), ("25-31", set(range(25, 32))), ("*/10", {1, 11, 21, 31})]
MONTHS = [("*", set(range(1, 13))), ("3,10", {3, 10}), ("mar,apr,sep,oct,nov", {3, 4, 9, 10, 11}), ("4", {4})]
DAYS_OF_WEEK = [("*", None), ("sun", {0}), ("0,6", {0, 6}), ("1-5", {1, 2, 3, 4, 5})]


@st.composite
def cron_cases(draw):
    parts = [
        draw(st.sampled_from(options)) for options in (MINUTES, HOURS, DAYS_OF_MONTH, MONTHS, DAYS_OF_WEEK)
    ]
    text = " ".join(p[0] for p in parts)
    minutes, hours, dom, months, dow = (p[1] for p in parts)

    def matches(local: datetime) -> bool:
        if local.minute not in minutes or local.hour not in hours or local.month not in months:
            return False
        weekday = (local.weekday() + 1) % 7  # cron: Sunday = 0
        if dom is not None and dow is not None:  # both restricted: either may match
            return local.day in dom or weekday in dow
        return (dom is None or local.day in dom) and (dow is None or weekday in dow)

    return text, matches


def transition_days(zone: ZoneInfo) -> list[datetime]:
    """UTC instants of this zone's offset changes in 2026 (found by hourly scanning)."""
    out, t = [], datetime(2026, 1, 1, tzinfo=UTC)
    while t.year == 2026:
        if (t + timedelta(hours=1)).astimezone(zone).utcoffset() != t.astimezone(zone).utcoffset():
            out.append(t)
        t += timedelta(hours=1)
    return out or [datetime(2026, 6, 1, tzinfo=UTC)]


_TRANSITIONS = {name: transition_days(ZoneInfo(name)) for name in DST_ZONES}


@st.composite
def afters(draw, zone_name):
    """Instants close to one of the zone's 2026 transitions, where the trouble is."""
    base = draw(st.sampled_from(_TRANSITIONS[zone_name]))
    return base + timedelta(
        minutes=draw(st.integers(-36 * 60, 36 * 60)), seconds=draw(st.sampled_from([0, 0, 1, 30, 59]))
    )


@st.composite
def scenarios(draw):
    zone_name = draw(st.sampled_from(DST_ZONES))
    text, matches = draw(cron_cases())
    dst = DstPolicy(
        gap=draw(st.sampled_from(["shift", "skip"])), overlap=draw(st.sampled_from(["once", "twice"]))
    )
    return zone_name, text, matches, dst, draw(afters(zone_name))


def oracle(
    zone: ZoneInfo, matches, dst: DstPolicy, after: datetime, until: datetime
) -> list[tuple[datetime, str | None]]:
    """Brute force, minute by minute over UTC, with the policy written out literally."""
    found: dict[datetime, str | None] = {}
    t = after.replace(second=0, microsecond=0) - timedelta(hours=4)
    while t <= until:
        local = t.astimezone(zone)
        before = (t - timedelta(minutes=1)).astimezone(zone)
        wall = local.replace(tzinfo=None)
        other = wall.replace(tzinfo=zone, fold=1 - local.fold).astimezone(UTC)
        twice = other != t and other.astimezone(zone).replace(tzinfo=None) == wall
        if matches(wall):
            if not twice:
                found[t] = found.get(t)
            elif local.fold == 0:
                found[t] = "overlap_first"
            elif dst.overlap == "twice":
                found[t] = "overlap_second"
        if dst.gap == "shift" and local.replace(tzinfo=None) - before.replace(tzinfo=None) > timedelta(
            minutes=1
        ):
            # The clock jumped at t: every skipped wall-clock minute that matches runs at t.
            skipped = before.replace(tzinfo=None) + timedelta(minutes=1)
            while skipped < wall:
                if matches(skipped):
                    found[t] = "gap_shifted"
                    break
                skipped += timedelta(minutes=1)
        t += timedelta(minutes=1)
    return sorted((at, flag) for at, flag in found.items() if after < at <= until)


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_matches_brute_force_oracle(case):
    zone_name, text, matches, dst, after = case
    zone = ZoneInfo(zone_name)
    until = after + timedelta(hours=10)
    schedule = cron(text, zone_name, end_at=until)
    got = [(i.at, i.dst) for i in preview(schedule, dst, after, 1000)]
    assert got == oracle(zone, matches, dst, after, until), text


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_fire_times_increase_never_land_in_a_gap_and_repeat_only_when_twice(case):
    zone_name, text, matches, dst, after = case
    zone = ZoneInfo(zone_name)
    items = preview(cron(text, zone_name), dst, after, 40)
    assert items, text  # every generated expression fires within 100 years
    ats = [i.at for i in items]
    assert all(a < b for a, b in pairwise(ats))
    assert ats[0] > after
    per_wall_time: dict[datetime, int] = {}
    for item in items:
        assert item.at.tzinfo is not None and item.at.utcoffset() == timedelta(0)
        # The local time exists: converting it back gives the same instant.
        wall = item.local.replace(tzinfo=None)
        assert wall.replace(tzinfo=zone, fold=item.local.fold).astimezone(UTC) == item.at
        # (not `local == at`: PEP 495 makes inter-zone == False for ambiguous times)
        assert item.local.astimezone(UTC) == item.at
        if item.dst == "gap_shifted":
            assert dst.gap == "shift"
            # A shifted run sits exactly where the clock jumped forward.
            assert (item.at - timedelta(seconds=1)).astimezone(zone).utcoffset() < item.at.astimezone(
                zone
            ).utcoffset()
        else:
            assert matches(wall), (text, item)
        per_wall_time[wall] = per_wall_time.get(wall, 0) + 1
    for n in per_wall_time.values():
        assert n <= 2
        if n == 2:
            assert dst.overlap == "twice"


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_next_fire_is_strictly_monotone(case):
    zone_name, text, _matches, dst, after = case
    schedule = cron(text, zone_name)
    first = next_fire(schedule, dst, after, ANCHOR)
    assert first is not None and first > after
    second = next_fire(schedule, dst, first, ANCHOR)
    assert second is not None and second > first
    # Chaining next_fire and one preview walk agree.
    assert [i.at for i in preview(schedule, dst, after, 2)] == [first, second]
    # Asking from just before an occurrence finds it again.
    assert next_fire(schedule, dst, second - timedelta(microseconds=1), ANCHOR) == second


def test_generated_expressions_are_all_valid():
    # The strategies above only mean something if croniter accepts every combination.
    for parts in (MINUTES, HOURS, DAYS_OF_MONTH, MONTHS, DAYS_OF_WEEK):
        for text, _ in parts:
            fields = ["*"] * 5
            fields[[MINUTES, HOURS, DAYS_OF_MONTH, MONTHS, DAYS_OF_WEEK].index(parts)] = text
            assert parse_cron(" ".join(fields))


def test_oracle_sanity_on_the_berlin_gap():
    # The oracle itself must see the 15-minute merge, or the property proves nothing.
    zone = ZoneInfo("Europe/Berlin")
    got = oracle(
        zone, lambda w: w.minute % 15 == 0, SHIFT_ONCE, Z("2026-03-29T00:40:00Z"), Z("2026-03-29T01:15:00Z")
    )
    assert got == [
        (Z("2026-03-29T00:45:00Z"), None),
        (Z("2026-03-29T01:00:00Z"), "gap_shifted"),
        (Z("2026-03-29T01:15:00Z"), None),
    ]


def test_islice_of_preview_is_a_prefix():
    schedule = cron("*/30 * * * *", "Europe/Berlin")
    long = preview(schedule, SHIFT_TWICE, Z("2026-10-24T22:00:00Z"), 12)
    assert preview(schedule, SHIFT_TWICE, Z("2026-10-24T22:00:00Z"), 5) == list(islice(long, 5))
