"""bench.faults' tally: what landed for each occurrence, counted without I/O."""

from __future__ import annotations

import itertools

from bench.faults import tally


def test_one_landing_each_is_neither_duplicate_nor_missing():
    assert tally(["a", "b", "c"], ["a", "b", "c"]) == {
        "written": 3,
        "distinct": 3,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
    }


def test_landings_beyond_one_per_occurrence_are_duplicates():
    counted = tally(["a", "a", "a", "b", "b", "c"], ["a", "b", "c"])
    assert (counted["written"], counted["distinct"], counted["duplicates"]) == (6, 3, 3)
    assert counted["missing"] == 0


def test_an_occurrence_that_never_landed_is_missing():
    counted = tally(["a", "a"], ["a", "b", "c"])
    assert (counted["distinct"], counted["duplicates"], counted["missing"]) == (1, 1, 2)


def test_a_key_not_expected_is_unexpected_not_a_duplicate():
    counted = tally(["a", "x", "x"], ["a"])
    assert counted == {"written": 3, "distinct": 1, "duplicates": 0, "missing": 0, "unexpected": 2}


def test_nothing_landed():
    assert tally([], ["a", "b"]) == {
        "written": 0,
        "distinct": 0,
        "duplicates": 0,
        "missing": 2,
        "unexpected": 0,
    }


def test_counts_add_up_for_every_small_multiset():
    expected = ["a", "b", "c"]
    for size in range(5):
        for written in itertools.product(["a", "b", "c", "x"], repeat=size):
            counted = tally(written, expected)
            assert counted["written"] == len(written)
            assert counted["written"] == counted["distinct"] + counted["duplicates"] + counted["unexpected"]
            assert counted["distinct"] + counted["missing"] == len(expected)
            assert counted["distinct"] == len(set(written) & set(expected))


def test_the_unrecorded_bound_is_calls_in_flight_and_two_completion_batches():
    from app.worker.buffer import MAX_ITEMS
    from bench.faults import unrecorded_bound

    assert unrecorded_bound(3, 128) == 3 * (128 + 2 * MAX_ITEMS) == 1584
