"""Each owner's share of a claim batch (app.pollers.shares), and owners taking turns in messages."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from app.core.weights import DEFAULT_WEIGHT, MAX_WEIGHT, MIN_WEIGHT, weight_of
from app.lifecycle.message import round_robin
from app.pollers.shares import fair_shares

T = datetime(2026, 1, 1, tzinfo=UTC)


def _due(*owners: str) -> list[str]:
    return list(owners)


def shares_of(*args, **kwargs) -> list[tuple[str, int]]:
    return fair_shares(*args, **kwargs).takes


def test_one_owner_takes_the_whole_batch():
    assert shares_of(_due("a"), {}, 500) == [("a", 500)]


def test_two_owners_split_the_batch_and_the_odd_row_goes_to_the_one_next_in_turn():
    assert shares_of(_due("b", "a"), {}, 501) == [("a", 251), ("b", 250)]
    assert shares_of(_due("b", "a"), {}, 501, after="a") == [("b", 251), ("a", 250)]


def test_the_rest_of_a_round_is_shared_by_weight_and_the_odd_row_goes_round():
    # 10 rows for weights 3 and 1: two whole rounds (6 + 2), 2 rows left: 1 by weight to
    # heavy, and 1 odd row to whoever is next in turn; the next batch starts after it.
    first = fair_shares(_due("heavy", "light"), {"heavy": 3}, 10)
    assert first == ([("heavy", 8), ("light", 2)], "heavy")
    second = fair_shares(_due("heavy", "light"), {"heavy": 3}, 10, after=first.turn_ends)
    assert second == ([("light", 3), ("heavy", 7)], "light")
    assert fair_shares(_due("heavy", "light"), {"heavy": 3}, 10, after=second.turn_ends) == first
    assert fair_shares(_due("a", "b"), {}, 10).turn_ends is None  # whole rounds: nothing odd


def test_over_many_batches_the_service_is_in_weight_proportion_within_a_row_per_batch():
    weights = {"a": 3, "b": 2}
    served = {"a": 0, "b": 0, "c": 0}
    after = None
    for _ in range(20):
        shares = fair_shares(_due("a", "b", "c"), weights, 500, after)
        for owner, take in shares.takes:
            served[owner] += take
        after = shares.turn_ends if shares.turn_ends is not None else after
    exact = {"a": 5000, "b": 10000 / 3, "c": 5000 / 3}  # 10,000 rows as 3:2:1
    assert all(abs(served[owner] - exact[owner]) <= 20 for owner in served), served


def test_weights_are_proportional():
    assert shares_of(_due("a", "b"), {"a": 3}, 500) == [("a", 375), ("b", 125)]
    assert shares_of(_due("a", "b", "c"), {"b": 2}, 8) == [("a", 2), ("b", 4), ("c", 2)]


def test_more_owners_than_rows_take_turns_across_batches():
    owners = [f"o{i:04}" for i in range(1000)]
    first = shares_of(_due(*owners), {}, 400)
    assert first == [(owner, 1) for owner in owners[:400]]
    assert fair_shares(_due(*owners), {}, 400).turn_ends == first[-1][0]
    second = shares_of(_due(*owners), {}, 400, after=first[-1][0])
    assert second == [(owner, 1) for owner in owners[400:800]]
    third = shares_of(_due(*owners), {}, 400, after=second[-1][0])
    assert third == [(owner, 1) for owner in owners[800:] + owners[:200]]


def test_more_owners_than_rows_with_weights_the_last_round_is_cut_to_the_batch():
    assert shares_of(_due("a", "b", "c"), {"a": 2, "b": 3}, 4) == [("a", 2), ("b", 2)]


def test_turns_wrap_around_and_an_owner_gone_from_the_list_is_skipped():
    assert shares_of(_due("a", "c", "d"), {}, 2, after="b") == [("c", 1), ("d", 1)]
    assert shares_of(_due("a", "c"), {}, 1, after="c") == [("a", 1)]


def test_nothing_due_or_no_room_gives_no_share():
    assert shares_of([], {}, 500) == []
    assert shares_of(_due("a"), {}, 0) == []


def test_bad_weights_are_clamped_not_trusted():
    assert shares_of(_due("a", "b"), {"a": 0, "b": -5}, 4) == [("a", 2), ("b", 2)]
    assert shares_of(_due("a", "b"), {"a": 10**9}, MAX_WEIGHT + 1) == [("a", MAX_WEIGHT), ("b", 1)]


def test_a_stored_weight_is_read_within_its_bounds_or_as_the_default():
    assert [weight_of(v) for v in (5, 0, -3, 10**9, "7", 2.9)] == [
        5,
        MIN_WEIGHT,
        MIN_WEIGHT,
        MAX_WEIGHT,
        7,
        2,
    ]
    assert [weight_of(v) for v in (None, "heavy", "")] == [DEFAULT_WEIGHT] * 3


def test_property_shares_fill_the_batch_in_weight_proportion():
    rng = random.Random(15)
    for _ in range(2000):
        n = rng.randint(1, 40)
        owners = [f"o{i:02}" for i in range(n)]
        weights = {owner: rng.randint(1, 5) for owner in owners if rng.random() < 0.5}
        limit = rng.randint(1, 600)
        after = rng.choice([None, *owners])
        shares = shares_of(owners, weights, limit, after)
        total_weight = sum(weights.get(owner, 1) for owner in owners)
        assert sum(take for _, take in shares) == limit  # a share is never wasted on paper
        assert len({owner for owner, _ in shares}) == len(shares)
        assert all(take >= 1 for _, take in shares)
        if total_weight <= limit:  # every owner served, each within one round of its weighted part
            assert len(shares) == n
            rounds = limit // total_weight
            for owner, take in shares:
                assert rounds * weights.get(owner, 1) <= take <= (rounds + 1) * weights.get(owner, 1)
        else:  # those served are the ones next in turn after `after`, wrapping around
            start = 0 if after is None else owners.index(after) + 1
            in_turn = (owners[start:] + owners[:start])[: len(shares)]
            assert [owner for owner, _ in shares] == in_turn


def test_round_robin_takes_turns_and_keeps_each_owners_order():
    items = ["a1", "a2", "a3", "b1", "c1", "c2"]
    assert round_robin(items, key=lambda s: s[0]) == ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert round_robin(["a1", "a2"], key=lambda s: s[0]) == ["a1", "a2"]
    assert round_robin([], key=lambda s: s) == []


def test_a_small_owner_has_the_first_message_of_a_big_owners_batch_to_itself():
    from app.lifecycle.message import message_headers, to_messages
    from tests.unit.test_message import run

    batch = [run(owner="big") for _ in range(450)] + [run(owner="small") for _ in range(3)]
    messages = to_messages(batch, T)
    assert len(messages) == 6
    assert [entry["owner"] for entry in messages[0][1]] == ["small"] * 3
    assert message_headers(messages[0][1])["punctual_owner"] == "small"
    assert all(message_headers(entries)["punctual_owner"] == "big" for _, entries in messages[1:])
    assert sum(len(entries) for _, entries in messages) == 453
