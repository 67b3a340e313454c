"""The fast path to a cron job's next occurrence gives the slow path's answers.

next_fire remembers each cron occurrence it computed (app.core.schedules), iter_fires
starts from that remembered first one, and a search starts from a copy of an
expression's croniter expanded once (app.core.cron). The reference here is the
computation as it was without any of them: a croniter built for every search, the
full DST resolution walked from `after`, nothing remembered. Both must agree on every
instant, for generated expressions (5 and 6 fields), zones, DST policies and instants
around each DST transition, and exhaustively on a grid of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core import cron as cron_module
from app.core import schedules
from app.core.cron import parse_cron
from app.core.schedules import DstPolicy, Schedule, iter_fires, next_fire, preview
from tests.unit.test_cron_dst import _TRANSITIONS, DST_ZONES, cron_cases

POLICIES = [DstPolicy(gap, overlap) for gap in ("shift", "skip") for overlap in ("once", "twice")]
ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)  # irrelevant to cron, required by the API
SECONDS = ["0", "30", "*/20", "5,35", "*"]  # a 6th field (seconds first), or none


@contextmanager
def slow_path() -> Iterator[None]:
    """The computation as it was: a croniter built (and expanded) for every search."""
    fast = cron_module._iterator
    cron_module._iterator = lambda form, start: croniter(form, start)
    try:
        yield
    finally:
        cron_module._iterator = fast


def slow_fires(schedule: Schedule, dst: DstPolicy, after: datetime, count: int) -> list[datetime]:
    """The first `count` occurrences after `after`, walked from `after`, nothing remembered."""
    with slow_path():
        return [item.at for item in preview(schedule, dst, after, count)]


def chained(schedule: Schedule, dst: DstPolicy, after: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    at: datetime | None = after
    while len(out) < count:
        at = next_fire(schedule, dst, at, ANCHOR)
        if at is None:
            break
        out.append(at)
    return out


@st.composite
def cases(draw):
    zone = draw(st.sampled_from(DST_ZONES))
    text, _matches = draw(cron_cases())
    seconds = draw(st.sampled_from([None, *SECONDS]))
    if seconds is not None:
        text = f"{seconds} {text}"
    after = draw(st.sampled_from(_TRANSITIONS[zone])) + timedelta(
        minutes=draw(st.integers(-36 * 60, 36 * 60)),
        seconds=draw(st.sampled_from([0, 0, 1, 30, 59])),
        microseconds=draw(st.sampled_from([0, 0, 1, 999_999])),
    )
    bounds = draw(st.sampled_from(["none", "start", "end"]))
    start_at = after + timedelta(hours=draw(st.integers(-3, 3))) if bounds == "start" else None
    end_at = after + timedelta(hours=draw(st.integers(0, 30))) if bounds == "end" else None
    schedule = Schedule(kind="cron", cron=text, timezone=zone, start_at=start_at, end_at=end_at)
    return schedule, draw(st.sampled_from(POLICIES)), after


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_property_fast_next_fire_iter_fires_and_chains_match_the_slow_walk(case):
    schedule, dst, after = case
    schedules.next_cron_fire.cache_clear()  # the first next_fire computes, the second remembers
    expected = slow_fires(schedule, dst, after, 12)
    first = expected[0] if expected else None
    assert next_fire(schedule, dst, after, ANCHOR) == first
    assert next_fire(schedule, dst, after, ANCHOR) == first  # remembered: the same answer
    assert list(islice(iter_fires(schedule, dst, after, ANCHOR), 12)) == expected
    assert chained(schedule, dst, after, 12) == expected
    # A search that starts at each occurrence finds the ones after it, from the cache too.
    for i, at in enumerate(expected[:-1]):
        assert next_fire(schedule, dst, at, ANCHOR) == expected[i + 1]


EXPRESSIONS = [
    "0 0 * * *",
    "30 2 * * *",  # in the gap or the overlap of most European and American zones
    "*/15 * * * *",
    "0 1-3 * * *",
    "15 30 2 * * *",  # 6 fields: 02:30:15
    "*/20 59 1 * * *",
    "0 0 0,2,23 * * 0,6",
]
GRID_ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana", "UTC"]


@pytest.mark.parametrize("zone", GRID_ZONES)
def test_exhaustive_grid_around_each_transition_matches_the_slow_path(zone):
    # Every expression x policy x instant, every 37 minutes (so every minute of the
    # hour is met, ahead of and inside each gap and overlap) for 36 hours around each
    # of the zone's transitions: the next occurrence, from the cache and without it.
    afters = [
        transition + timedelta(minutes=37 * k) for transition in _TRANSITIONS[zone] for k in range(-29, 30)
    ]
    for text in EXPRESSIONS:
        schedule = Schedule(kind="cron", cron=text, timezone=zone)
        for dst in POLICIES:
            for after in afters:
                expected = slow_fires(schedule, dst, after, 1)
                assert [next_fire(schedule, dst, after, ANCHOR)] == (expected or [None]), (text, dst, after)


def test_a_search_never_changes_the_shared_expansion():
    form = parse_cron("*/20 59 1 * * sun,sat").croniter_form
    fresh = croniter(form, datetime(2000, 1, 1))
    start = datetime(2026, 3, 28, 23, 0)
    # Two searches of one expression, interleaved, each from a copy of the expansion.
    first, second = cron_module._iterator(form, start), cron_module._iterator(form, start + timedelta(days=3))
    walked = [(first.get_next(datetime), second.get_next(datetime)) for _ in range(50)]
    again = cron_module._iterator(form, start)
    assert [again.get_next(datetime) for _ in range(50)] == [pair[0] for pair in walked]
    assert cron_module._expanded(form).expanded == fresh.expanded
    assert cron_module._expanded(form).get_current(datetime) == datetime(2000, 1, 1)


def test_threads_sharing_the_cache_get_the_answers_of_one_thread():
    zone = "Europe/Berlin"
    base = _TRANSITIONS[zone][0]
    work = [
        (Schedule(kind="cron", cron=text, timezone=zone), dst, base + timedelta(minutes=11 * k))
        for text in EXPRESSIONS
        for dst in POLICIES
        for k in range(-6, 6)
    ]
    expected = [slow_fires(schedule, dst, after, 1) or [None] for schedule, dst, after in work]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda item: [next_fire(item[0], item[1], item[2], ANCHOR)], work * 3))
    assert got == expected * 3


def test_the_cache_is_bounded_and_never_holds_an_error():
    assert schedules.next_cron_fire.cache_info().maxsize is not None
    assert cron_module._expanded.cache_info().maxsize is not None
    schedule = Schedule(kind="cron", cron="0 0 * * *", timezone="Europe/Berlin")
    for _ in range(2):  # a naive instant is refused every time, not once and then answered
        with pytest.raises(ValueError):
            next_fire(schedule, DstPolicy(), datetime(2026, 5, 1), ANCHOR)
        with pytest.raises(ValueError):
            next_fire(schedule, DstPolicy(), datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 1))


def test_a_past_year_9999_answer_is_none_from_the_cache_too():
    schedule = Schedule(kind="cron", cron="0 0 29 2 *", timezone="Pacific/Chatham")
    late = datetime(9999, 3, 1, tzinfo=UTC)
    assert next_fire(schedule, DstPolicy(), late, ANCHOR) is None
    assert next_fire(schedule, DstPolicy(), late, ANCHOR) is None
    assert list(iter_fires(schedule, DstPolicy(), late, ANCHOR)) == []


def test_zones_and_dst_policies_never_share_a_remembered_answer():
    # 02:30 on Berlin's spring-forward day: each zone and each gap policy has its own
    # answer, asked one after the other of one cache, each as it is without the cache.
    schedules.next_cron_fire.cache_clear()
    after = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)
    asked = [
        (zone, dst)
        for zone in ("Europe/Berlin", "Europe/London", "America/New_York", "UTC")
        for dst in POLICIES
    ]
    answers = {}
    for zone, dst in asked * 2:
        schedule = Schedule(kind="cron", cron="30 2 * * *", timezone=zone)
        expected = slow_fires(schedule, dst, after, 1)
        answers[zone, dst] = next_fire(schedule, dst, after, ANCHOR)
        assert [answers[zone, dst]] == (expected or [None]), (zone, dst)
    assert schedules.next_cron_fire.cache_info().currsize == len(asked)
    assert answers["Europe/Berlin", DstPolicy("shift", "once")] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert answers["Europe/Berlin", DstPolicy("skip", "once")] == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)


def test_a_rows_next_occurrence_is_its_schedules():
    from app.lifecycle.cursor import following
    from app.registry.records import dst_columns, schedule_columns

    after = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    for zone in ("Europe/Berlin", "America/New_York", "UTC"):
        for dst in POLICIES:
            for schedule in (
                Schedule(kind="cron", cron="30 2 * * *", timezone=zone),
                Schedule(kind="cron", cron="*/20 * * * * *", timezone=zone, end_at=after),
                Schedule(kind="interval", interval_s=90),
            ):
                job = {**schedule_columns(schedule), **dst_columns(dst), "created_at": ANCHOR}
                assert following(job, after) == next_fire(schedule, dst, after, ANCHOR)
    with pytest.raises(ValueError):  # naive: refused, never answered from the cache
        following({**job, "schedule_kind": "cron", "cron": "0 0 * * *"}, datetime(2026, 5, 1))
