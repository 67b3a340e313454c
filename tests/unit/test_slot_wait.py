"""Waiting in the worker for a concurrency slot: the pure estimate, the waiter's
wake-ups and the releaser (threads, no I/O)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from app.limits import LimitSpec
from app.worker.slot_wait import (
    BATCH_RUNS,
    HAND_OVER_FOR_S,
    MAX_WAIT_S,
    POLL_S,
    Slot,
    SlotReleaser,
    SlotWaits,
    batch_size,
    expected_slot_at,
    pick_runs,
    takes_handed_slots,
    wait_budget_s,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_wait_is_short_and_well_inside_the_lease():
    assert wait_budget_s(60) == MAX_WAIT_S
    assert wait_budget_s(3) == 0.3


def test_runs_come_back_in_turn_at_the_pace_slots_freed():
    # 10 slots a second went to waiting runs: the 1st run left comes back in 0.1 s, the 20th in 2 s.
    assert expected_slot_at(NOW, 0, 10.0, 2.0, 4) == NOW + timedelta(seconds=0.1)
    assert expected_slot_at(NOW, 19, 10.0, 2.0, 4) == NOW + timedelta(seconds=2.0)


def test_when_no_slot_freed_each_round_of_the_cap_takes_at_least_the_wait():
    times = [expected_slot_at(NOW, position, 0.0, 2.0, 4) for position in range(9)]
    assert times == [NOW + timedelta(seconds=s) for s in [2.0] * 4 + [4.0] * 4 + [6.0]]
    assert expected_slot_at(NOW, 0, 0.0, 0.0, 4) == NOW + timedelta(seconds=POLL_S)  # never "now"


def test_a_few_slots_in_a_stalled_wait_never_put_a_run_later_than_no_slot_at_all():
    """Redis paused for 4 s of a 4.5 s wait: 2 slots came. At that pace the 100th run's
    turn would be 225 s out; no later than if none had come, it is 4.5 s."""
    pace = 2 / 4.5
    assert expected_slot_at(NOW, 99, pace, 4.5, 200) == NOW + timedelta(seconds=4.5)
    assert expected_slot_at(NOW, 0, pace, 4.5, 200) == NOW + timedelta(seconds=2.25)
    # behind a cap of 4, the 100th run is 25 rounds out
    assert expected_slot_at(NOW, 99, 0.01, 2.0, 4) == NOW + timedelta(seconds=50.0)


def test_a_batch_is_worth_a_try_sooner_behind_a_small_cap():
    assert batch_size(waiting=500, smallest_cap=200) == BATCH_RUNS
    assert batch_size(waiting=5, smallest_cap=200) == 5  # every run waiting
    assert batch_size(waiting=76, smallest_cap=20) == 5
    assert batch_size(waiting=76, smallest_cap=4) == 1  # each freed slot counts


def test_a_waiter_wakes_on_a_release_it_has_not_seen():
    waits = SlotWaits()
    seen = waits.released
    woke = threading.Event()

    def waiter():
        waits.wait(seen, 30)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    waits.notify()
    assert woke.wait(10)
    thread.join()


def test_a_waiter_sleeps_until_enough_slots_were_released():
    waits = SlotWaits()
    seen = waits.released
    waits.notify(2)
    assert waits.wait(seen, 0.01, enough=3) == seen + 2  # not enough: it slept its timeout
    waits.notify(1)
    assert waits.wait(seen, 30, enough=3) == seen + 3  # enough: at once


def test_only_as_many_waiting_runs_are_tried_as_their_caps_have_free_slots():
    own, shared = LimitSpec("own", max_concurrency=2), LimitSpec("all", max_concurrency=10)
    waiting = [(f"r{i}", [own, shared]) for i in range(4)] + [("other", [shared])]
    now, later = pick_runs(waiting, {"own": 1, "all": 2})
    assert [name for name, _ in now] == ["r0", "other"]
    assert [name for name, _ in later] == ["r1", "r2", "r3"]
    assert pick_runs(waiting, {}) == ([], waiting)


def test_a_release_before_the_wait_is_not_lost():
    waits = SlotWaits()
    seen = waits.released
    waits.notify()  # a call ended between the limiter's answer and the wait
    assert waits.wait(seen, 30) == seen + 1  # returns at once


def test_the_releaser_releases_in_batches_then_wakes_the_waiters():
    waits = SlotWaits()
    released: list[list] = []
    gate = threading.Event()

    def release(items):
        gate.wait(10)
        released.append(items)

    releaser = SlotReleaser(release, waits)
    seen = waits.released
    releaser.put("first")
    releaser.put_many(["second", "third"])
    gate.set()
    waits.wait(seen, 10)
    releaser.stop()
    assert [item for batch in released for item in batch] == ["first", "second", "third"]
    assert len(released) <= 2 and waits.released > seen


def test_a_failed_release_still_wakes_the_waiters():
    waits = SlotWaits()
    seen = waits.released

    def release(items):
        raise ConnectionError("redis is away")

    releaser = SlotReleaser(release, waits)
    releaser.put("slot")
    assert waits.wait(seen, 10) > seen
    releaser.stop()


# -- a slot handed from a call that ended to a run waiting in the same process -------

OWN, SHARED = LimitSpec("own", max_concurrency=2), LimitSpec("all", max_concurrency=10)
RATED = LimitSpec("own", max_concurrency=2, rate_per_s=5)
MARGIN_S = 5.0


def live_slot(now: float = 100.0, holder: str = "r0.ab") -> Slot:
    return Slot(holder, since=now, until=now + 30)


def test_only_a_run_without_a_rate_and_with_a_cap_takes_handed_slots():
    assert takes_handed_slots([OWN, SHARED]) == {"own", "all"}
    assert takes_handed_slots([OWN, LimitSpec("b", rate_per_s=1)]) is None  # a rate sees every start
    assert takes_handed_slots([RATED]) is None
    assert takes_handed_slots([]) is None  # no cap: it never waits


def test_a_slot_goes_to_the_first_run_waiting_under_exactly_the_same_caps():
    waits = SlotWaits()
    line = waits.open(
        [("only-own", [OWN]), ("rated", [RATED, SHARED]), ("a", [OWN, SHARED]), ("b", [SHARED, OWN])]
    )
    slot = live_slot()
    assert waits.hand_over([OWN, SHARED], slot, 100.0, MARGIN_S)
    assert waits.hand_over([SHARED, OWN], slot, 100.0, MARGIN_S)  # the order of specs does not matter
    assert not waits.hand_over([OWN, SHARED], slot, 100.0, MARGIN_S)  # nobody else waits under both
    handed = waits.take_handed(line)
    assert [(h.entry[0], h.slot) for h in handed] == [("a", slot), ("b", slot)]
    assert [name for name, _ in waits.entries(line)] == ["only-own", "rated"]
    assert waits.take_handed(line) == []


def test_a_slot_near_its_lease_end_or_passed_on_for_long_goes_back_to_the_limiter():
    waits = SlotWaits()
    line = waits.open([("a", [OWN])])
    ending = Slot("r0.ab", since=100.0, until=100.0 + MARGIN_S)  # would run out before a's first heartbeat
    assert not waits.hand_over([OWN], ending, 100.0, MARGIN_S)
    old = Slot("r0.ab", since=100.0, until=200.0)
    assert not waits.hand_over([OWN], old, 100.0 + HAND_OVER_FOR_S, MARGIN_S)  # other processes' turn
    assert waits.hand_over([OWN], old, 100.0 + HAND_OVER_FOR_S / 2, MARGIN_S)
    assert [h.entry[0] for h in waits.take_handed(line)] == ["a"]


def test_runs_taken_out_to_be_tried_are_not_handed_a_slot_until_put_back():
    waits = SlotWaits()
    line = waits.open([("a", [OWN]), ("b", [OWN])])
    tried = waits.take(line, {"own": 1})
    assert [name for name, _ in tried] == ["a"]
    assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)  # b
    assert not waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)  # a is being tried: not offered
    waits.put_back(line, tried)  # still waiting (the limiter said the cap is full)
    assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)
    assert [h.entry[0] for h in waits.take_handed(line)] == ["b", "a"]


def test_a_closed_line_is_offered_nothing_and_gives_back_what_it_had():
    waits = SlotWaits()
    line = waits.open([("a", [OWN]), ("b", [OWN]), ("c", [SHARED])])
    assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)
    handed, left = waits.close(line)
    assert [h.entry[0] for h in handed] == ["a"]
    assert [name for name, _ in left] == ["b", "c"]
    assert not waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)  # b waits no more here


def test_a_waiter_wakes_when_one_of_its_runs_is_handed_a_slot():
    waits = SlotWaits()
    line = waits.open([("a", [OWN])])
    other = waits.open([("x", [SHARED])])
    seen = waits.released
    assert waits.wait(seen, 0.01, waiting=line) == seen  # nothing for it: it slept its timeout
    woke = threading.Event()

    def waiter():
        waits.wait(seen, 30, enough=BATCH_RUNS, waiting=line)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waits.hand_over([SHARED], live_slot(), 100.0, MARGIN_S)  # to the other line: no wake-up
    assert not woke.wait(0.05)
    assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)
    assert woke.wait(10)
    thread.join()
    assert [h.entry[0] for h in waits.take_handed(other)] == ["x"]


def test_handed_runs_gather_into_one_start_until_a_batch_or_the_timeout():
    waits = SlotWaits()
    line = waits.open([(f"r{i}", [OWN]) for i in range(4)])
    assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)
    # Fewer than a batch: it waits out its timeout, then takes what came.
    assert [h.entry[0] for h in waits.take_handed(line, enough=3, timeout_s=0.01)] == ["r0"]

    def end_two_calls():
        for _ in range(2):
            assert waits.hand_over([OWN], live_slot(), 100.0, MARGIN_S)

    thread = threading.Thread(target=end_two_calls)
    thread.start()
    # A batch's worth: it returns as soon as the second slot is in, long before 30 s.
    assert [h.entry[0] for h in waits.take_handed(line, enough=2, timeout_s=30)] == ["r1", "r2"]
    thread.join()
