"""Waiting in the worker for a concurrency slot: the pure estimate and the gate on a
real event loop with the in-memory limiter (no I/O)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from app.limits import LimitSpec, LocalLimiter
from app.limits.line import ANYONE, Turn
from app.worker.slot_wait import (
    HAND_OVER_FOR_S,
    MAX_WAIT_S,
    PARK_S,
    POLL_S,
    Slot,
    SlotGate,
    cap_keys,
    expected_slot_at,
    runs_to_try,
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


def test_only_as_many_waiting_runs_are_tried_as_their_caps_grant_their_flows():
    both, shared_only = frozenset({"own", "all"}), frozenset({"all"})
    waiting = {both: {"oa": 4}, shared_only: {"oa": 1, "ob": 2}}

    def grants(own: int, all_a: int, all_b: int = 0) -> dict:
        return {"own": {"oa": own}, "all": {"oa": all_a, "ob": all_b}}

    assert runs_to_try(waiting, grants(1, 2)) == {(both, "oa"): 1, (shared_only, "oa"): 1}
    assert runs_to_try(waiting, grants(3, 3)) == {(both, "oa"): 3}  # in order: the first line first
    assert runs_to_try(waiting, grants(9, 9, 9)) == {
        (both, "oa"): 4,
        (shared_only, "oa"): 1,
        (shared_only, "ob"): 2,
    }
    # "own" grants a none (full, or not looked at); b's own turn on "all" is b's
    assert runs_to_try(waiting, {"all": {"oa": 5, "ob": 1}}) == {
        (shared_only, "oa"): 1,
        (shared_only, "ob"): 1,
    }
    assert runs_to_try(waiting, {}) == {}


# -- the gate --------------------------------------------------------------------

OWN, SHARED = LimitSpec("own", max_concurrency=2), LimitSpec("all", max_concurrency=10)
LEASE_S, MARGIN_S = 30.0, 5.0


class CountingLimiter(LocalLimiter):
    """The in-memory limiter, counting the admissions asked of it and recording the
    (cap key, holder) slots given back to it."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.asked: list[int] = []
        self.released: list[tuple[str, str]] = []
        self.fail = fail

    def _release(self, items):
        self.released += items
        super()._release(items)

    def _acquire(self, requests, now, lease_s, line):
        self.asked.append(len(requests))
        if self.fail:
            raise ConnectionError("redis is away")
        return super()._acquire(requests, now, lease_s, line)


class Gate:
    """A SlotGate driven as the engine drives it, each run named after its item: `take`
    answers a future of the run's slot, None once the run is put off."""

    def __init__(self, limiter, wait_s: float, in_line=lambda item: None):
        self.put_off: list = []
        self.released = limiter.released
        self._answers: dict = {}
        self.gate = SlotGate(limiter, LEASE_S, MARGIN_S, wait_s, self._started, self._waited, str, in_line)

    def take(self, caps: list, item: str, turn: Turn = ANYONE) -> asyncio.Future:
        answer = asyncio.get_running_loop().create_future()
        slot = self.gate.take(item, caps, cap_keys(caps), turn)
        if slot is None:
            self._answers[item] = answer
        else:
            answer.set_result(slot)
        return answer

    def give(self, caps: list, slot: Slot) -> bool:
        return self.gate.give(caps, cap_keys(caps), slot)

    async def settled(self) -> None:
        await self.gate.settled()

    def _started(self, item: str, slot: Slot) -> None:
        answer = self._answers.pop(item)
        assert not answer.done(), f"{item} answered twice"
        answer.set_result(slot)

    def _waited(self, items: list) -> None:  # (on a thread, as the engine's)
        self.put_off.extend(items)
        for item, _ in items:
            answer = self._answers.pop(item)
            answer.get_loop().call_soon_threadsafe(answer.set_result, None)


def make_gate(limiter=None, wait_s: float = 1.0, in_line=lambda item: None):
    gate = Gate(limiter or CountingLimiter(), wait_s, in_line)
    return gate, gate.put_off, gate.released


async def fill(gate: Gate) -> tuple:
    """Take both slots of OWN, for runs "a" and "b"."""
    return await gate.take([OWN], "a"), await gate.take([OWN], "b")


async def full_with_one_waiting(gate: Gate) -> asyncio.Future:
    """OWN's two slots taken by "a" and "b", and "c" waiting for one (a few polls in)."""
    await fill(gate)
    waiting = gate.take([OWN], "c")
    await asyncio.sleep(POLL_S * 3)
    assert not waiting.done()
    return waiting


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_messages_runs_ask_together_and_the_cap_admits_only_its_slots():
    limiter = CountingLimiter()
    gate, put_off, _ = make_gate(limiter, wait_s=0.05)

    async def scenario():
        answers = await asyncio.gather(*(gate.take([OWN], f"r{i}") for i in range(5)))
        await gate.settled()
        return answers

    slots = run(scenario())
    assert limiter.asked[0] == 5  # one admission for all five
    assert [s is not None for s in slots] == [True, True, False, False, False]
    assert [item for item, _ in put_off] == ["r2", "r3", "r4"]  # waited their while: put off


def test_runs_that_find_their_caps_full_are_told_once_that_they_wait_in_line():
    """(A run whose name went out of the roll ahead puts it back then: app.worker.engine.)"""
    told: list[str] = []
    gate, put_off, _ = make_gate(wait_s=0.2, in_line=told.append)

    async def scenario():
        await fill(gate)  # admitted: not in line
        gate.take([OWN], "c")  # refused at its admission
        await asyncio.sleep(POLL_S * 3)
        gate.take([OWN], "d")  # behind c, in the line at once
        await asyncio.sleep(0.3)  # asked again at the looks, then put off
        await gate.settled()

    run(scenario())
    assert told == ["c", "d"]
    assert [item for item, _ in put_off] == ["c", "d"]


def test_a_slot_goes_straight_to_the_first_run_waiting_under_exactly_the_same_caps():
    limiter = CountingLimiter()
    gate, _, released = make_gate(limiter)

    async def scenario():
        first, second = await fill(gate)
        other = gate.take([OWN, SHARED], "x")  # other caps
        third = gate.take([OWN], "c")
        fourth = gate.take([OWN], "d")
        await asyncio.sleep(POLL_S * 3)  # all wait: the cap is full
        assert not (other.done() or third.done() or fourth.done())
        asked = len(limiter.asked)
        assert gate.give([OWN], first)  # to c, the first in line under exactly [OWN]
        assert await third is first  # the same slot, under its name
        assert not fourth.done() and not other.done()
        assert gate.give([OWN], second)
        assert await fourth is second
        # Nobody else waits under [OWN], and the cap was found full: not parked, back to
        # the limiter for every process's runs.
        assert not gate.give([OWN], first)
        assert len(limiter.asked) - asked <= 3  # polls only: no admission for a handed slot
        assert await other is None  # never handed a slot of [OWN] alone: put off in time

    run(scenario())
    assert released == []  # (giving back is the caller's, after give() said no)


def test_slots_given_back_in_one_turn_go_in_one_round_trip_and_the_waiting_runs_look_at_once():
    limiter = CountingLimiter()
    gate, put_off, released = make_gate(limiter)
    round_trips: list[list] = []
    real = limiter._release_async

    async def counted(items):
        round_trips.append(list(items))
        await real(items)

    limiter._release_async = counted  # type: ignore[method-assign]

    async def scenario():
        first, second = await fill(gate)
        waiting = gate.take([OWN, SHARED], "c")  # other caps: no slot is handed to it
        await asyncio.sleep(POLL_S * 3)
        gate.gate.release([OWN], first.holder)
        gate.gate.release([OWN], second.holder)
        assert released == []  # not before the turn ends
        began = time.monotonic()
        slot = await waiting
        assert time.monotonic() - began < POLL_S * 5  # woken by the release, not left to a poll
        assert slot.holder == "c"

    run(scenario())
    assert round_trips[0] == [("own", "a"), ("own", "b")]
    assert put_off == []


def test_a_slot_near_its_lease_end_or_passed_on_for_long_goes_back_to_the_limiter():
    gate, _, _ = make_gate()

    async def scenario():
        waiting = await full_with_one_waiting(gate)
        now = time.monotonic()
        assert not gate.give([OWN], Slot("a", now, now + MARGIN_S))  # ends before c's first heartbeat
        assert not gate.give([OWN], Slot("a", now - HAND_OVER_FOR_S, now + LEASE_S))  # other processes' turn
        assert gate.give([OWN], Slot("a", now - HAND_OVER_FOR_S / 2, now + LEASE_S))
        assert (await waiting).holder == "a"

    run(scenario())


def test_a_waiting_run_takes_a_slot_freed_by_another_process_at_the_next_poll():
    limiter = CountingLimiter()
    gate, put_off, _ = make_gate(limiter)

    async def scenario():
        waiting = await full_with_one_waiting(gate)
        asked = len(limiter.asked)
        await asyncio.sleep(POLL_S * 5)
        assert len(limiter.asked) == asked  # a full cap is only read, not asked again
        limiter.release_many([([OWN], "a")])  # another process's call ended
        slot = await waiting
        assert slot.holder == "c"  # admitted anew under its own name

    run(scenario())
    assert put_off == []


def test_a_newcomer_waits_behind_the_runs_already_waiting_under_its_caps():
    limiter = CountingLimiter()
    gate, _, _ = make_gate(limiter)

    async def scenario():
        early = await full_with_one_waiting(gate)
        late = gate.take([OWN], "d")
        await asyncio.sleep(0)
        limiter.release_many([([OWN], "a")])  # one slot frees: it is c's, who came first
        assert (await early).holder == "c"
        await asyncio.sleep(POLL_S * 3)
        assert not late.done()
        limiter.release_many([([OWN], "b")])
        assert (await late).holder == "d"

    run(scenario())


def test_runs_put_off_are_given_turns_at_the_pace_slots_came_while_they_waited():
    gate, put_off, _ = make_gate(wait_s=0.3)

    async def scenario():
        slots = [await gate.take([OWN], n) for n in ("a", "b")]
        waiters = [gate.take([OWN], f"w{i}") for i in range(6)]
        await asyncio.sleep(POLL_S * 2)
        for slot in slots:  # two slots handed on while they wait; none afterwards
            assert gate.give([OWN], slot)
        answers = await asyncio.gather(*waiters)
        await gate.settled()
        return answers

    began = datetime.now(UTC)
    answers = run(scenario())
    assert [a is not None for a in answers] == [True, True, False, False, False, False]
    turns = [at for _, at in put_off]
    assert [item for item, _ in put_off] == ["w2", "w3", "w4", "w5"]
    assert turns == sorted(turns) and turns[0] > began  # in line, none "now"
    # Two slots came in 0.3 s: the fourth run left is due about 4 / (2 / 0.3) = 0.6 s out.
    assert turns[-1] - turns[0] >= timedelta(seconds=0.3)


def test_a_limiter_that_stays_away_leaves_no_run_waiting_for_ever():
    limiter = CountingLimiter(fail=True)
    gate, put_off, _ = make_gate(limiter, wait_s=0.1)

    async def scenario():
        answers = await asyncio.gather(*(gate.take([OWN], n) for n in ("a", "b")))
        await gate.settled()
        return answers

    answers = run(scenario())
    assert answers == [None, None]
    assert [item for item, _ in put_off] == ["a", "b"]


# -- slots parked between calls --------------------------------------------------


def test_a_slot_whose_call_ended_goes_to_the_next_run_under_the_same_caps_while_the_cap_has_room():
    limiter = CountingLimiter()
    gate, _, released = make_gate(limiter)

    async def scenario():
        first = await gate.take([SHARED], "a")
        assert gate.give([SHARED], first)  # kept: nobody found SHARED full
        asked = len(limiter.asked)
        again = await gate.take([SHARED], "b")
        assert again is first  # the same slot, under its name, without asking the limiter
        assert len(limiter.asked) == asked
        assert await gate.take([OWN, SHARED], "c") is not first  # other caps: its own

    run(scenario())
    assert released == []
    assert limiter.free_slots({SHARED.key: 10}, time.time()) == {SHARED.key: 8}  # a's (with b) and c's


def test_a_parked_slot_nobody_takes_goes_back_to_the_limiter_after_a_while():
    limiter = CountingLimiter()
    gate, _, released = make_gate(limiter)

    async def scenario():
        slots = [await gate.take([SHARED], n) for n in ("a", "b")]
        for slot in slots:
            assert gate.give([SHARED], slot)
        await asyncio.sleep(PARK_S / 2)
        assert released == []
        await asyncio.sleep(PARK_S * 2)
        assert sorted(holder for _, holder in released) == ["a", "b"]

    run(scenario())


def test_a_slot_past_its_hand_over_time_is_not_parked():
    gate, _, _ = make_gate()

    async def scenario():
        now = time.monotonic()
        assert not gate.give([SHARED], Slot("a", now - HAND_OVER_FOR_S, now + LEASE_S))
        assert not gate.give([SHARED], Slot("a", now, now + MARGIN_S))

    run(scenario())


def test_slots_parked_while_runs_were_asked_for_go_to_those_runs():
    """A call ends while the admission of c is under way: its slot is parked (nobody
    waits yet). The admission finds the cap full: c takes the parked slot at once, not
    at a poll."""
    answering = asyncio.Event()

    class SlowLimiter(CountingLimiter):
        async def _acquire_async(self, requests, now, lease_s, line):
            if len(self.asked) >= 2:
                await asyncio.wait_for(answering.wait(), 10)
            return await super()._acquire_async(requests, now, lease_s, line)

    limiter = SlowLimiter()
    gate, put_off, released = make_gate(limiter)

    async def scenario():
        first, _ = await fill(gate)
        waiting = gate.take([OWN], "c")
        await asyncio.sleep(POLL_S)  # c's admission is under way
        assert gate.give([OWN], first)  # parked
        answering.set()
        slot = await asyncio.wait_for(waiting, PARK_S / 2)
        assert slot is first

    run(scenario())
    assert released == [] and put_off == []


def test_settling_gives_the_parked_slots_back():
    gate, _, released = make_gate()

    async def scenario():
        slot = await gate.take([SHARED], "a")
        assert gate.give([SHARED], slot)
        await gate.settled()
        assert released == [("all", "a")]

    run(scenario())


# -- owners taking turns ---------------------------------------------------------

A, B = Turn("a"), Turn("b")


async def drained(*gates: Gate) -> None:
    """Wait until the runs still waiting are put off, and the gates settle."""
    while any(gate.gate.waiting for gate in gates):
        await asyncio.sleep(POLL_S)
    for gate in gates:
        await gate.settled()


def test_a_slot_ending_goes_to_the_owner_whose_turn_it_is_not_to_the_run_that_came_first():
    gate, _, _ = make_gate(wait_s=0.3)

    async def scenario():
        first = await gate.take([OWN], "a1", A)
        second = await gate.take([OWN], "a2", A)
        early = [gate.take([OWN], f"a{i}", A) for i in range(3, 6)]
        await asyncio.sleep(POLL_S * 3)
        late = gate.take([OWN], "b1", B)  # B's one run comes after A's backlog
        await asyncio.sleep(POLL_S * 3)  # (a look: A's two slots are charged to A)
        assert gate.give([OWN], first)
        assert await late is first  # B first: A was served twice already
        assert gate.give([OWN], second)
        assert await early[0] is second
        assert not early[1].done()
        await drained(gate)

    run(scenario())


def test_a_slot_goes_back_to_the_limiter_when_the_turn_is_an_owner_waiting_in_another_process():
    limiter = CountingLimiter()
    here, _, released = make_gate(limiter, wait_s=0.3)
    there, _, _ = make_gate(limiter, wait_s=0.3)

    async def scenario():
        slots = [await here.take([OWN], f"a{i}", A) for i in range(2)]
        backlog = [here.take([OWN], f"a{i}", A) for i in range(2, 6)]
        waiting = there.take([OWN], "b1", B)  # another process's run of B
        await asyncio.sleep(POLL_S * 4)  # both processes looked: B waits elsewhere, and is next
        assert not here.give([OWN], slots[0])  # not to A's next run: back to the limiter, for B
        here.gate.release([OWN], slots[0].holder)
        assert (await waiting).holder == "b1"  # admitted anew under its own name, at B's poll
        await asyncio.sleep(POLL_S * 4)  # B waits no more (its process said so at its look)
        assert here.give([OWN], slots[1])
        assert await backlog[0] is slots[1]
        await drained(here, there)

    run(scenario())
    assert ("own", "a0") in released


def test_a_process_serves_its_owners_by_weight_and_recurring_runs_first():
    limiter = CountingLimiter()
    gate, _, _ = make_gate(limiter, wait_s=1.0)
    heavy, light, tick = Turn("heavy", weight=2), Turn("light"), Turn("light", recurring=True)
    cap = [LimitSpec("one", max_concurrency=1)]

    async def scenario():
        slot = await gate.take(cap, "first", light)
        runs = {gate.take(cap, f"h{i}", heavy): "h" for i in range(20)}
        runs.update({gate.take(cap, f"l{i}", light): "l" for i in range(20)})
        await asyncio.sleep(POLL_S * 3)
        ticks = {gate.take(cap, f"t{i}", tick): "t" for i in range(2)}
        runs.update(ticks)
        order = []
        for _ in range(20):
            assert gate.give(cap, slot)
            done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
            (answer,) = done
            order.append(runs.pop(answer))
            slot = answer.result()
        await drained(gate)
        return "".join(order)

    order = run(scenario())
    assert order.startswith("tt")  # the recurring lane first
    # Two of heavy's for one of light's (light was served the first slot, and wins no tie).
    rest = order[2:]
    assert rest.count("h") in (12, 13) and "hhhh" not in rest and "ll" not in rest, order


def test_runs_that_wait_for_another_full_cap_are_not_recorded_waiting_for_this_one():
    """B's runs under [OWN, SHARED] wait for OWN (full): SHARED, which has room, must not
    keep slots for them from the owners of other processes."""
    limiter = CountingLimiter()
    gate, _, _ = make_gate(limiter, wait_s=0.3)

    async def scenario():
        await fill(gate)  # OWN's two slots
        waiting = [gate.take([OWN, SHARED], f"b{i}", B) for i in range(3)]
        await asyncio.sleep(POLL_S * 5)
        lines = limiter._keys
        assert [waiting for _, waiting in lines["own"].lines.values()] == [{"ob": (1, 3)}]
        assert lines["all"].lines == {}
        assert not any(w.done() for w in waiting)
        await drained(gate)

    run(scenario())


def test_a_process_whose_runs_wait_no_more_takes_its_record_back():
    limiter = CountingLimiter()
    gate, _, _ = make_gate(limiter)

    async def scenario():
        first, _ = await fill(gate)
        waiting = gate.take([OWN], "c", B)
        await asyncio.sleep(POLL_S * 3)
        assert limiter._keys["own"].lines
        assert gate.give([OWN], first)
        await waiting
        await asyncio.sleep(POLL_S * 3)
        assert limiter._keys["own"].lines == {}

    run(scenario())
