"""A message's runs take call slots as they free, a few dozen at a time (threads, no I/O)."""

from __future__ import annotations

import threading
import time

from app.worker.engine import take_call_slots


def test_free_slots_are_taken_at_once_up_to_what_is_wanted():
    slots = threading.BoundedSemaphore(128)
    assert take_call_slots(slots, 100, 50) == 100
    assert take_call_slots(slots, 100, 20) == 28  # 28 were left: more than the floor, all of them
    assert not slots.acquire(blocking=False)


def test_it_waits_for_the_floor_not_for_all_it_wants_then_takes_what_is_free():
    slots = threading.BoundedSemaphore(128)
    for _ in range(100):
        slots.acquire()  # 100 calls in flight, 28 free
    taken: list[int] = []
    waiter = threading.Thread(target=lambda: taken.append(take_call_slots(slots, 100, 50)))
    waiter.start()
    time.sleep(0.05)
    assert taken == []  # 28 free: fewer than the floor of 50
    for _ in range(30):
        slots.release()  # 30 calls ended: 58 free
    waiter.join(10)
    assert taken == [58]  # not 100: it starts what it has and waits for the rest later


def test_a_message_smaller_than_the_floor_waits_for_all_of_its_runs():
    slots = threading.BoundedSemaphore(10)
    for _ in range(8):
        slots.acquire()
    taken: list[int] = []
    waiter = threading.Thread(target=lambda: taken.append(take_call_slots(slots, 5, 50)))
    waiter.start()
    time.sleep(0.05)
    assert taken == []
    for _ in range(3):
        slots.release()
    waiter.join(10)
    assert taken == [5]
