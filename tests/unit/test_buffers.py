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
            raise ConnectionError("database away")

    buffer = CompletionBuffer(flaky, max_items=1, max_delay_s=0.01)
    buffer.add("a")
    deadline = time.monotonic() + 2
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    buffer.close()
    assert calls[:2] == [["a"], ["a"]]  # after the first pause, 0.1 s, not a whole second


def test_a_batch_is_retried_whole_while_the_database_is_away(caplog):
    calls: list[list] = []

    def away_three_times(items):
        calls.append(list(items))
        if len(calls) <= 3:
            raise ConnectionError("database away")

    buffer = CompletionBuffer(away_three_times, max_items=3, max_delay_s=5)
    for item in "abc":
        buffer.add(item)
    buffer.close()
    assert calls == [["a", "b", "c"]] * 4  # never split: the failure was not theirs
    warnings = [r.getMessage() for r in caplog.records if r.name == "punctual.completion"]
    assert len(warnings) == 2 and "retrying" in warnings[0] and "after 3 failures" in warnings[1]
    assert all(r.exc_info is None for r in caplog.records)


class Poisoned(Exception):
    pass


def _refusing(poison: set, written: list):
    """A flush that fails (not transiently) for any batch holding an item of `poison`."""

    def flush(items):
        if poison.intersection(items):
            raise Poisoned(f"cannot write {sorted(poison.intersection(items))}\nand a second line")
        written.extend(items)

    return flush


def test_one_item_that_cannot_be_written_is_recorded_instead_and_never_blocks_the_others(caplog):
    written: list = []
    salvaged: list = []

    def salvage(item, failure):
        salvaged.append((item, type(failure).__name__))
        return f"{item} failed"

    buffer = CompletionBuffer(
        _refusing({"p"}, written), max_items=8, max_delay_s=5, salvage=salvage, give_up=lambda item: None
    )
    for item in ["a", "b", "c", "p", "d", "e", "f", "g"]:
        buffer.add(item)
    buffer.close()
    assert sorted(written) == sorted(["a", "b", "c", "d", "e", "f", "g", "p failed"])
    assert salvaged == [("p", "Poisoned")]
    [line] = [r for r in caplog.records if r.name == "punctual.completion"]
    assert "'p' could not be recorded (Poisoned: cannot write ['p'])" in line.getMessage()
    assert "second line" not in line.getMessage() and line.exc_info is None


def test_an_item_that_cannot_be_written_even_as_a_failure_is_given_up_with_one_line(caplog):
    from app import metrics

    written: list = []
    given_up: list = []
    before = metrics.COMPLETIONS_GIVEN_UP._value.get()
    buffer = CompletionBuffer(
        _refusing({"p", "p failed", "q"}, written),
        max_items=5,
        max_delay_s=5,
        salvage=lambda item, _failure: f"{item} failed" if item == "p" else None,
        give_up=given_up.append,
        name=lambda item: f"item {item}",
    )
    for item in ["a", "p", "b", "q", "c"]:
        buffer.add(item)
    buffer.close()
    assert sorted(written) == ["a", "b", "c"] and given_up == ["p", "q"]
    assert metrics.COMPLETIONS_GIVEN_UP._value.get() == before + 2
    lines = [r.getMessage() for r in caplog.records if r.name == "punctual.completion"]
    assert len(lines) == 2
    assert all("given up" in line for line in lines) and "item p could not be recorded" in lines[0]


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
