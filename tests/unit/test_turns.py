"""Which waiting dispatch message goes next (app.worker.turns), and the turnstile that keeps
at most one per pool process in the pool (app.tasks.turnstile), without Celery or I/O."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from kombu.common import QoS

from app.lifecycle.message import message_headers, to_messages
from app.tasks.turnstile import SETTLE_ROUNDS, Turnstile, _when_ended, settle_prefetch, ticks_in_pool
from app.worker.turns import Turns
from tests.unit.test_message import NOW, run


def drain(turns: Turns) -> list:
    out = []
    while (item := turns.pop()) is not None:
        out.append(item)
    return out


def test_the_recurring_lane_goes_first_whatever_came_before_it():
    turns: Turns[str] = Turns()
    for i in range(50):
        turns.push(f"burst-{i}", "one-off", "a", 100)
    turns.push("tick", "recurring", "a", 1)
    assert turns.pop() == "tick"
    assert len(turns) == 50


def test_an_owner_with_a_few_runs_goes_before_another_owners_backlog():
    turns: Turns[str] = Turns()
    for i in range(100):
        turns.push(f"a-{i}", "one-off", "a", 100)
    assert turns.pop() == "a-0"
    assert turns.pop() == "a-1"
    turns.push("b-0", "one-off", "b", 10)
    assert turns.pop() == "b-0"
    assert turns.pop() == "a-2"


def test_owners_with_backlogs_share_by_runs_served_not_by_messages():
    turns: Turns[str] = Turns()
    for i in range(40):
        turns.push(f"a-{i}", "one-off", "a", 100)  # big messages
        for j in range(4):
            turns.push(f"b-{i}-{j}", "one-off", "b", 25)  # the same runs in smaller ones
    first = [item.split("-")[0] for item in drain(turns)[:100]]
    runs = Counter({"a": first.count("a") * 100, "b": first.count("b") * 25})
    assert abs(runs["a"] - runs["b"]) <= 100, runs


def test_each_owners_messages_keep_their_order():
    turns: Turns[tuple[str, int]] = Turns()
    for i in range(30):
        for owner in "abc":
            turns.push((owner, i), "one-off", owner, 1 + i % 7)
    served = drain(turns)
    for owner in "abc":
        assert [i for o, i in served if o == owner] == list(range(30))


def test_an_owner_back_after_a_pause_starts_level_not_ahead_by_its_idle_time():
    turns: Turns[str] = Turns()
    turns.push("b-old", "one-off", "b", 100)
    for i in range(20):
        turns.push(f"a-{i}", "one-off", "a", 100)
    drain(turns)
    # b was idle while a was served 2,000 runs: it comes back level, so the two take turns.
    for i in range(5):
        turns.push(f"a-new-{i}", "one-off", "a", 100)
        turns.push(f"b-new-{i}", "one-off", "b", 100)
    order = [item[0] for item in drain(turns)]
    assert order.count("a") == order.count("b") == 5
    assert "bbb" not in "".join(order) and "aaa" not in "".join(order), order


def test_an_unknown_lane_counts_as_one_off():
    turns: Turns[str] = Turns()
    turns.push("odd", "express", "a", 1)
    turns.push("tick", "recurring", "a", 1)
    assert drain(turns) == ["tick", "odd"]


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["recurring", "one-off"]), st.integers(1, 200))
    )
)
def test_every_message_comes_out_once_and_the_count_is_kept(pushes):
    turns: Turns[int] = Turns()
    for n, (owner, lane, runs) in enumerate(pushes):
        turns.push(n, lane, owner, runs)
    assert len(turns) == len(pushes)
    out = drain(turns)
    assert sorted(out) == list(range(len(pushes))) and len(turns) == 0
    lanes = [pushes[n][1] for n in out]
    assert lanes == sorted(lanes, key=lambda lane: lane != "recurring")


@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from("abcdefgh"), st.sampled_from(["recurring", "one-off"]), st.integers(1, 5)
            ),
            st.just(None),  # a pop
        ),
        max_size=200,
    )
)
def test_each_pop_serves_an_owner_served_least_among_those_waiting_in_its_lane(steps):
    """Pushes and pops interleaved: the owner served next is always one whose service is
    the lowest of the owners waiting in the first lane with anyone waiting, and each
    owner's messages keep their order."""
    turns: Turns[tuple[str, str, int]] = Turns()
    waiting: dict[tuple[str, str], list[int]] = {}
    for n, step in enumerate(steps):
        if step is not None:
            owner, lane, runs = step
            turns.push((owner, lane, n), lane, owner, runs)
            waiting.setdefault((lane, owner), []).append(n)
            continue
        lane_first = next(
            (lane for lane in ("recurring", "one-off") if any(k[0] == lane for k in waiting)), None
        )
        if lane_first is None:
            assert turns.pop() is None
            continue
        levels = {o: turns.served(lane_first, o) for (lane, o) in waiting if lane == lane_first}
        owner, lane, n_popped = turns.pop()
        assert lane == lane_first and levels[owner] == min(levels.values())
        queue = waiting[(lane, owner)]
        assert queue.pop(0) == n_popped
        if not queue:
            del waiting[(lane, owner)]


# The turnstile.


class FakeRequest:
    def __init__(self, name: str):
        self.name = name
        self.expired = False
        self.on_success = lambda *a, **k: None
        self.on_failure = lambda *a, **k: None
        self.revoked = lambda: self.expired


def test_the_gate_keeps_at_most_limit_requests_in_the_pool_and_lets_the_next_in_when_one_ends():
    in_pool: list[FakeRequest] = []
    turnstile = Turnstile(2, in_pool.append)
    requests = [FakeRequest(f"a-{i}") for i in range(5)]
    for request in requests:
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 100)
    assert [r.name for r in in_pool] == ["a-0", "a-1"] and turnstile.waiting() == 3
    late = FakeRequest("b-0")
    _when_ended(late, turnstile.done)
    turnstile.offer(late, "one-off", "b", 10)
    in_pool[0].on_success((False, None, 0.1))
    in_pool[0].on_success((False, None, 0.1))  # a second callback of one request counts once
    assert [r.name for r in in_pool] == ["a-0", "a-1", "b-0"]
    in_pool[1].on_failure(None)
    assert [r.name for r in in_pool][-1] == "a-2" and turnstile.waiting() == 2


def test_a_pool_that_runs_the_request_inside_submit_does_not_nest_the_gate():
    """The solo pool: submit runs the task and calls its callback before returning."""
    served: list[str] = []
    depth = [0, 0]  # current, deepest

    def submit(request):
        depth[0] += 1
        depth[1] = max(depth)
        served.append(request.name)
        request.on_success((False, None, 0.0))
        depth[0] -= 1

    turnstile = Turnstile(1, submit)
    for i in range(500):
        request = FakeRequest(f"r-{i}")
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 1)
    assert len(served) == 500 and depth[1] == 1 and turnstile.waiting() == 0


def test_a_failing_submit_gives_its_slot_back():
    calls: list[str] = []

    def submit(request):
        calls.append(request.name)
        if request.name == "bad":
            raise RuntimeError("pool closed")

    turnstile = Turnstile(1, submit)
    for name in ("bad", "good"):
        request = FakeRequest(name)
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 1)
    assert calls == ["bad", "good"]


def test_the_gate_is_safe_from_many_threads():
    in_pool: list[FakeRequest] = []
    lock = threading.Lock()

    def submit(request):
        with lock:
            in_pool.append(request)

    turnstile = Turnstile(4, submit)
    requests = [FakeRequest(str(i)) for i in range(400)]
    for request in requests:
        _when_ended(request, turnstile.done)

    def offer(part):
        for request in part:
            turnstile.offer(request, "one-off", request.name[-1], 1)

    threads = [threading.Thread(target=offer, args=(requests[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    finished = 0
    while finished < 400:
        with lock:
            pending = in_pool[finished:]
        assert len(pending) <= 4
        ending = [threading.Thread(target=r.on_success, args=((False, None, 0.0),)) for r in pending]
        for thread in ending:
            thread.start()
        for thread in ending:
            thread.join()
        finished += len(pending)
    assert len(in_pool) == 400 and turnstile.waiting() == 0


# The messages the turnstile reads.


def test_recurring_runs_travel_apart_and_first_and_say_so_in_their_headers():
    batch = [run(owner="a") for _ in range(150)] + [run(owner="a", recurring=True) for _ in range(3)]
    messages = to_messages(batch, NOW)
    lanes = [message_headers(entries)["punctual_lane"] for _, entries in messages]
    assert lanes == ["recurring", "one-off", "one-off"]
    assert [len(entries) for _, entries in messages] == [3, 75, 75]
    assert all(entry.get("recurring") for entry in messages[0][1])


def test_a_thousand_owners_with_one_run_each_share_a_few_messages():
    batch = [run(owner=f"o{i}") for i in range(1000)]
    messages = to_messages(batch, NOW)
    assert len(messages) == 10
    assert message_headers(messages[0][1]) == {
        "punctual_lane": "one-off",
        "punctual_owner": "o0",
        "punctual_runs": 100,
    }


def test_owners_are_forgotten_once_nobody_waits_so_memory_stays_bounded():
    turns: Turns[int] = Turns()
    turns.push(-1, "one-off", "backlog", 1)
    for n in range(2_000):
        turns.push(n, "one-off", f"owner-{n}", 1)
    assert turns.served("one-off", "owner-1999") is not None
    drain(turns)
    assert all(turns.served("one-off", f"owner-{n}") is None for n in range(2_000))


def test_messages_held_in_the_gate_widen_the_prefetch_window_and_give_it_back():
    in_pool: list[FakeRequest] = []
    window = [0]
    turnstile = Turnstile(
        2, in_pool.append, prefetch=lambda change: window.__setitem__(0, window[0] + change), hold_max=8
    )
    for i in range(5):
        request = FakeRequest(str(i))
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 100)
    # By what waits, plus one per process: room for the next poll or message.
    assert turnstile.waiting() == 3 and window[0] == 5
    for i in range(5, 9):
        request = FakeRequest(str(i))
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 100)
    assert turnstile.waiting() == 7 and window[0] == 8  # at most hold_max
    finished = 0
    while finished < len(in_pool):
        in_pool[finished].on_success((False, None, 0.0))
        finished += 1
    assert len(in_pool) == 9 and turnstile.waiting() == 0 and window[0] == 0


def test_a_closed_gate_hands_the_pool_nothing_more():
    in_pool: list[FakeRequest] = []
    turnstile = Turnstile(1, in_pool.append)
    requests = [FakeRequest(str(i)) for i in range(3)]
    for request in requests:
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 1)
    turnstile.close()
    in_pool[0].on_success((False, None, 0.0))
    assert [r.name for r in in_pool] == ["0"] and turnstile.waiting() == 2


def test_a_consumer_restarted_after_a_lost_connection_drops_what_waited_and_serves_again():
    in_pool: list[FakeRequest] = []
    window = [0]
    turnstile = Turnstile(
        1, in_pool.append, prefetch=lambda change: window.__setitem__(0, window[0] + change)
    )
    for i in range(4):
        request = FakeRequest(str(i))
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "a", 1)
    assert turnstile.waiting() == 3 and window[0] == 4
    turnstile.close()  # Celery stops the consumer's steps, then starts them again
    assert turnstile.reopen() == 3
    window[0] = 0  # the new connection's window
    in_pool[0].on_success((False, None, 0.0))
    assert len(in_pool) == 1 and turnstile.waiting() == 0 and window[0] == 0
    request = FakeRequest("after")
    _when_ended(request, turnstile.done)
    turnstile.offer(request, "one-off", "a", 1)
    assert in_pool[-1].name == "after"


def test_the_prefetch_window_is_sent_again_until_messages_read_meanwhile_stop_widening_it():
    """Sending the window reads the messages that arrive before the broker's answer; each
    held for its eta widens the window again, which is sent before the loop sleeps."""
    sent: list[int] = []
    arriving = [3, 2, 1]  # messages read while each `basic.qos` waits for its answer

    def basic_qos(prefetch_count: int) -> None:
        sent.append(prefetch_count)
        if arriving:
            qos.increment_eventually(arriving.pop(0))

    qos = QoS(basic_qos, 3)
    qos.update()
    qos.increment_eventually(1)
    settle_prefetch(SimpleNamespace(qos=qos))
    assert sent == [3, 7, 9, 10] and qos.prev == qos.value == 10


def test_settling_the_window_is_bounded_and_waits_for_a_consumer_that_has_none():
    settle_prefetch(SimpleNamespace(qos=None))  # before the Tasks step made it: nothing to send
    sent: list[int] = []

    def basic_qos(prefetch_count: int) -> None:
        sent.append(prefetch_count)
        qos.increment_eventually(1)  # a broker that never stops handing out messages

    qos = QoS(basic_qos, 3)
    qos.update()
    settle_prefetch(SimpleNamespace(qos=qos))
    assert len(sent) == 1 + SETTLE_ROUNDS


def test_a_request_found_revoked_on_its_way_to_the_pool_gives_its_place_back():
    """An expired poll is refused by Celery after it left the turnstile (the pool's semaphore
    held it), and then no success or failure callback ever comes."""
    in_pool: list[FakeRequest] = []
    turnstile = Turnstile(1, in_pool.append)
    first, second = FakeRequest("poll-1"), FakeRequest("poll-2")
    for request in (first, second):
        _when_ended(request, turnstile.done)
        turnstile.offer(request, "one-off", "", 1)
    assert [r.name for r in in_pool] == ["poll-1"]
    assert first.revoked() is False and [r.name for r in in_pool] == ["poll-1"]
    first.expired = True
    assert first.revoked() is True
    first.revoked()  # asked again: still counted once
    assert [r.name for r in in_pool] == ["poll-1", "poll-2"] and turnstile.waiting() == 0


def test_polls_and_sweeps_leave_one_process_to_the_dispatches():
    assert [ticks_in_pool(n) for n in (1, 2, 3, 8)] == [1, 1, 2, 7]
