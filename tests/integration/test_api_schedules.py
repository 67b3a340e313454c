"""GET /schedules/preview: instants in UTC and local time, DST flags, 422 per parameter."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def preview(caller, **query):
    response = caller.get("/schedules/preview", query_string=query)
    assert response.status_code == 200, response.get_json()
    return response.get_json()["items"]


def test_spring_gap_shifts_to_the_transition_instant(alice):
    items = preview(alice, cron="30 2 * * *", timezone="Europe/Berlin", after="2026-03-27T12:00:00Z", count=3)
    assert items == [
        {"at": "2026-03-28T01:30:00Z", "local": "2026-03-28T02:30:00+01:00", "dst": None},
        {"at": "2026-03-29T01:00:00Z", "local": "2026-03-29T03:00:00+02:00", "dst": "gap_shifted"},
        {"at": "2026-03-30T00:30:00Z", "local": "2026-03-30T02:30:00+02:00", "dst": None},
    ]


def test_spring_gap_skip(alice):
    items = preview(
        alice, cron="30 2 * * *", timezone="Europe/Berlin", after="2026-03-28T12:00:00Z", count=1, gap="skip"
    )
    assert items[0]["at"] == "2026-03-30T00:30:00Z"


def test_autumn_overlap_once_and_twice(alice):
    once = preview(alice, cron="30 2 * * *", timezone="Europe/Berlin", after="2026-10-24T12:00:00Z", count=2)
    assert once[0] == {
        "at": "2026-10-25T00:30:00Z",
        "local": "2026-10-25T02:30:00+02:00",
        "dst": "overlap_first",
    }
    twice = preview(
        alice,
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        after="2026-10-24T12:00:00Z",
        count=2,
        overlap="twice",
    )
    assert [i["dst"] for i in twice] == ["overlap_first", "overlap_second"]
    assert twice[1]["local"] == "2026-10-25T02:30:00+01:00"


def test_interval_preview_from_after_or_from_start_at(alice):
    items = preview(alice, interval_s=90, after="2026-01-01T00:00:00Z", count=2)
    assert [i["at"] for i in items] == ["2026-01-01T00:01:30Z", "2026-01-01T00:03:00Z"]
    grid = preview(
        alice, interval_s=3600, start_at="2025-12-31T23:20:00Z", after="2026-01-01T00:00:00Z", count=1
    )
    assert grid[0]["at"] == "2026-01-01T00:20:00Z"


def test_defaults_count_10_utc_after_now(alice):
    items = preview(alice, cron="* * * * *")
    assert len(items) == 10 and all(i["local"].endswith("+00:00") for i in items)


def test_six_field_cron_has_seconds_first(alice):
    items = preview(alice, cron="*/15 * * * * *", after="2026-01-01T00:00:00Z", count=2)
    assert [i["at"] for i in items] == ["2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z"]


@pytest.mark.parametrize(
    "query, fields",
    [
        ({}, {"cron"}),
        ({"cron": "* * * * *", "interval_s": "5"}, {"cron"}),
        ({"cron": "99 * * * *"}, {"cron"}),
        ({"cron": "* * * * *", "timezone": "Nowhere/Land"}, {"timezone"}),
        ({"cron": "* * * * *", "count": "0"}, {"count"}),
        ({"cron": "* * * * *", "count": "101"}, {"count"}),
        ({"cron": "* * * * *", "after": "2026-01-01T00:00:00"}, {"after"}),
        ({"cron": "* * * * *", "gap": "jump", "overlap": "thrice"}, {"gap", "overlap"}),
        ({"interval_s": "soon"}, {"interval_s"}),
        ({"interval_s": "0"}, {"interval_s"}),
        ({"cron": "bad", "timezone": "X", "count": "x"}, {"cron", "timezone", "count"}),
        ({"interval_s": "60", "after": "0001-01-01T00:00:00+08:02"}, {"after"}),  # before year 1 in UTC
        ({"interval_s": "60", "start_at": "0900-01-01T00:00:00Z"}, {"start_at"}),
    ],
)
def test_every_invalid_parameter_is_named(alice, query, fields):
    response = alice.get("/schedules/preview", query_string=query)
    assert response.status_code == 422
    assert {e["field"] for e in response.get_json()["errors"]} == fields


def test_preview_needs_an_api_key(api_app):
    assert api_app.test_client().get("/schedules/preview?cron=*+*+*+*+*").status_code == 401
