"""GET /jobs: newest first across every shard, cursors, filters, stable under inserts."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from app.core.timefmt import parse_instant
from tests.integration.api_fixtures import job_row, set_job

pytestmark = pytest.mark.integration


def walk(caller, **query) -> list[dict]:
    items, cursor = [], None
    while True:
        params = dict(query, **({"cursor": cursor} if cursor else {}))
        response = caller.get("/jobs", query_string=params)
        assert response.status_code == 200, response.get_json()
        page = response.get_json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def test_250_jobs_over_every_shard_are_each_listed_exactly_once(alice, api_settings):
    created = [alice.create(name=f"job-{i}")["id"] for i in range(250)]
    assert len({job_row(api_settings, j)["shard"] for j in created[:60]}) > 8  # many logical shards
    physical = {job_row(api_settings, j)["shard"] % 2 for j in created[:60]}
    assert physical == {0, 1}  # both DSNs hold some
    listed = walk(alice, limit=7)
    ids = [j["id"] for j in listed]
    assert len(ids) == len(set(ids)) == 250
    assert set(ids) == set(created)
    # Instants, not their strings: the wire form drops trailing zeros of the fraction
    # (".993Z" for .993000), so two instants in one millisecond do not sort as text.
    keys = [(parse_instant(j["created_at"]), j["id"]) for j in listed]
    assert keys == sorted(keys, reverse=True)  # newest first, ties broken by id
    assert ids[:3] == created[::-1][:3]


def test_default_and_maximum_page_sizes(alice):
    for i in range(3):
        alice.create(name=f"size-{i}")
    page = alice.get("/jobs").get_json()
    assert len(page["items"]) == 3 and page["next_cursor"] is None
    assert len(alice.get("/jobs", query_string={"limit": 500}).get_json()["items"]) == 3


def test_pagination_is_stable_under_concurrent_inserts(alice):
    before = [alice.create(name="stable")["id"] for _ in range(30)]
    seen, cursor, stop = [], None, threading.Event()

    # A client of its own: Flask's test client is not meant to be shared across threads.
    other = dataclasses.replace(alice, client=alice.client.application.test_client())

    def insert_meanwhile():
        while not stop.is_set():
            other.create(name="stable")

    inserter = threading.Thread(target=insert_meanwhile)
    inserter.start()
    try:
        while True:
            page = alice.get(
                "/jobs", query_string={"name": "stable", "limit": 4, **({"cursor": cursor} if cursor else {})}
            ).get_json()
            seen += [j["id"] for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    finally:
        stop.set()
        inserter.join()
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(before) <= set(seen)  # nothing that existed at the start is missed


def test_filters_state_and_exact_name(alice, api_settings):
    a = alice.create(name="report")
    b = alice.create(name="report")
    alice.create(name="report-2")
    set_job(api_settings, b["id"], state="paused")
    assert [j["id"] for j in walk(alice, name="report")] == [b["id"], a["id"]]
    assert [j["id"] for j in walk(alice, name="report", state="paused")] == [b["id"]]
    assert walk(alice, name="Report") == []
    assert len(walk(alice, name="", state="", limit="", cursor="")) == 3  # empty parameters are no filter


def test_owners_see_only_their_jobs(alice, bob):
    alice.create(name="mine")
    assert walk(bob) == []


@pytest.mark.parametrize(
    "query, field",
    [
        ({"state": "sleeping"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"name": "a\x00b"}, "name"),
    ],
)
def test_bad_parameters_are_422_naming_the_parameter(alice, query, field):
    response = alice.get("/jobs", query_string=query)
    assert response.status_code == 422
    assert response.get_json()["errors"][0]["field"] == field


def test_a_cursor_from_another_listing_is_422(alice, api_settings):
    from tests.integration.api_fixtures import insert_run

    job = alice.create()
    for _ in range(2):
        insert_run(api_settings, job)
    runs_cursor = alice.get(f"/jobs/{job['id']}/runs", query_string={"limit": 1}).get_json()["next_cursor"]
    assert runs_cursor
    assert alice.get("/jobs", query_string={"cursor": runs_cursor}).status_code == 422
