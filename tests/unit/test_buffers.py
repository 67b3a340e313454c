"""The completion buffer and the in-flight set (threads, no I/O)."""

from __future__ import annotations

import threading
import time
import uuid

from app.worker.buffer import CompletionBuffer
from app.worker.inflight import InFlight


def test_the_buffer_flushes_after_a_short_delay_without_waiting_for_more():
    flushed: list[list] = []
    done = threading.Event()
    buffer = CompletionBuffer(
        lambda items: (flushed.append(items), done.set()), max_items=200, max_delay_s=0.05
    )
    buffer.add(1)
    assert done.wait(2)
    assert flushed == [[1]]
    buffer.close()


def test_a_full_buffer_flushes_in_one_batch():
    flushed: list[list] = []
    gate = threading.Event()
    buffer = CompletionBuffer(
        lambda items: (gate.wait(5), flushed.append(items)), max_items=10, max_delay_s=5
    )
    for i in range(10):
        buffer.add(i)
    gate.set()
    buffer.close()
    assert [len(batch) for batch in flushed] == [10]


def test_under_load_a_batch_waits_longer_and_a_quiet_buffer_does_not():
    flushed: list[list] = []
    took = threading.Condition()

    def flush(items):
        with took:
            flushed.append(items)
            took.notify_all()

    def flushes(count: int, within_s: float) -> bool:
        with took:
            return took.wait_for(lambda: len(flushed) >= count, within_s)

    buffer = CompletionBuffer(flush, max_items=1000, max_delay_s=0.05, busy_delay_s=3, busy_rate=20)
    for i in range(10):
        buffer.add(i)
    assert flushes(1, 5)  # the first batch: after max_delay_s
    for i in range(10):  # 10 items within ~50 ms of the last batch: 200 a second
        buffer.add(i)
    assert flushes(2, 5)
    buffer.add("under load")
    assert not flushes(3, 1)  # busy: this batch may wait up to busy_delay_s (3 s), not 50 ms
    assert flushes(3, 10) and flushed[2] == ["under load"]
    # That batch came at 1 item in ~3 s: the rate is low again, and 50 ms it is.
    buffer.add("alone")
    assert flushes(4, 2) and flushed[3] == ["alone"]
    buffer.close()


def test_a_failed_flush_keeps_its_items():
    calls: list[list] = []

    def flaky(items):
        calls.append(list(items))
        if len(calls) == 1:
            raise RuntimeError("database away")

    buffer = CompletionBuffer(flaky, max_items=1, max_delay_s=0.01)
    buffer.add("a")
    deadline = time.monotonic() + 2
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    buffer.close()
    assert calls[:2] == [["a"], ["a"]]  # after the first pause, 0.1 s, not a whole second


def test_heartbeats_cover_what_is_in_flight_until_it_leaves():
    beats: list[list] = []
    inflight = InFlight(lambda items: beats.append(sorted(items)), interval_s=0.02)
    a, b = uuid.uuid4(), uuid.uuid4()
    inflight.add(a, "a")
    inflight.add(b, "b")
    time.sleep(0.1)
    assert ["a", "b"] in beats
    assert inflight.pop_many([a]) == ["a"] and len(inflight) == 1
    assert not inflight.wait_empty(0.01)
    inflight.pop_many([b])
    assert inflight.wait_empty(0.01)
    inflight.stop()
