"""Behaviour every Limiter must have (app.limits.limiter), whatever its storage.

tests/unit/test_local_limiter.py and tests/integration/test_redis_limiter.py run
these against their implementation by subclassing `LimiterContract` and providing
the `pair` fixture: two limiters that share state, as two worker processes would.
Every test injects `now`; none sleeps. `OnALoop` puts a limiter's event-loop forms
(`acquire_many_async`, ...) behind the blocking names, so that the same contract
holds for a caller on a loop (the worker's slot gate).
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from app.limits import LimitSpec
from app.limits.limiter import LINE_KEEP_S, Waiting
from app.limits.line import ANYONE, Turn

T0 = 1_000_000.0  # an exact float, so that token arithmetic has no rounding surprises
LEASE_S = 30.0


def admitted(admissions) -> list[bool]:
    return [a.admitted for a in admissions]


def simulate(limiter, spec, arrivals, until):
    """Runs arrive at their instants; a held run comes back at its retry time (as the
    registry would bring it back). Returns {run: start instant} and {run: holds}."""
    pending = [(at, i, name) for i, (at, name) in enumerate(arrivals)]
    heapq.heapify(pending)
    starts: dict[str, float] = {}
    holds = {name: 0 for _, name in arrivals}
    seq = len(pending)
    while pending and pending[0][0] <= until:
        at, _, name = heapq.heappop(pending)
        answer = limiter.acquire(spec, name, at, LEASE_S)
        if answer.admitted:
            starts[name] = at
        else:
            assert answer.retry_at > at
            holds[name] += 1
            seq += 1
            heapq.heappush(pending, (answer.retry_at, seq, name))
    return starts, holds


class OnALoop:
    """A limiter seen through its event-loop forms: each admission, release and count
    runs its `*_async` form on a loop of its own (closed with what it opened); the
    rest is the limiter's."""

    def __init__(self, limiter):
        self._limiter = limiter

    def __getattr__(self, name):
        return getattr(self._limiter, name)

    def _on_a_loop(self, operation, *args):
        async def once():
            try:
                return await operation(*args)
            finally:
                await self._limiter.aclose()

        return asyncio.run(once())

    def acquire_many(self, requests, now, lease_s, line=""):
        return self._on_a_loop(self._limiter.acquire_many_async, requests, now, lease_s, line)

    def acquire(self, specs, holder, now, lease_s, reserver=None, turn=ANYONE, line=""):
        return self.acquire_many([(specs, holder, reserver or holder, turn)], now, lease_s, line)[0]

    def look(self, line, waiting, now):
        return self._on_a_loop(self._limiter.look_async, line, waiting, now)

    def release_many(self, items):
        self._on_a_loop(self._limiter.release_many_async, list(items))

    def release(self, specs, holder):
        self.release_many([(specs, holder)])

    def free_slots(self, caps, now):
        return self._on_a_loop(self._limiter.free_slots_async, caps, now)


class LimiterContract:
    @pytest.fixture
    def limiter(self, pair):
        return pair[0]

    # -- token bucket -------------------------------------------------------------

    def test_a_bucket_admits_one_second_of_burst_at_once(self, limiter):
        spec = [LimitSpec("b", rate_per_s=5)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(50)], T0, LEASE_S)
        assert admitted(answers) == [True] * 5 + [False] * 45

    def test_a_held_run_is_held_once_and_starts_come_out_at_the_rate(self, limiter):
        # 300 runs at once and one more every 50 ms for 30 s; each held run comes back
        # at its retry time (as the registry brings it back), with the same reserver.
        rate = 10
        spec = [LimitSpec("b", rate_per_s=rate)]
        arrivals = [(T0, f"backlog{i}") for i in range(300)]
        arrivals += [(T0 + 0.05 * i, f"new{i}") for i in range(600)]
        starts, holds = simulate(limiter, spec, arrivals, until=T0 + 120)
        assert sorted(starts) == sorted(name for _, name in arrivals)  # every run started once
        assert max(holds.values()) == 1  # held at most once each
        times = sorted(starts.values())
        for i, begin in enumerate(times):  # one second of burst at the start, then never above the rate
            in_window = sum(1 for t in times[i : i + 2 * rate + 2] if t < begin + 1.0 - 1e-9)
            assert in_window <= (2 * rate if begin < T0 + 1 else rate)
        steady = [t for t in times if T0 + 1 <= t < T0 + 61]
        assert len(steady) == 60 * rate

    def test_a_reservation_belongs_to_the_reserver_not_the_holder(self, limiter):
        spec = [LimitSpec("b", rate_per_s=1)]
        assert limiter.acquire(spec, "run1", T0, LEASE_S, reserver="job").admitted
        held = limiter.acquire(spec, "run2", T0, LEASE_S, reserver="job2")
        assert held.reason == "rate" and held.retry_at == pytest.approx(T0 + 1)
        # The schedule run is made anew at the next claim: another holder, the same job.
        assert limiter.acquire(spec, "run3", held.retry_at, LEASE_S, reserver="job2").admitted

    def test_a_run_back_early_keeps_its_turn_and_reserves_no_other(self, limiter):
        spec = [LimitSpec("b", rate_per_s=1)]
        assert limiter.acquire(spec, "a", T0, LEASE_S).admitted
        held = limiter.acquire(spec, "b", T0, LEASE_S)
        early = limiter.acquire(spec, "b", T0 + 0.5, LEASE_S)
        assert early.reason == "rate" and early.retry_at == held.retry_at
        newcomer = limiter.acquire(spec, "c", T0 + 0.5, LEASE_S)
        assert newcomer.retry_at == pytest.approx(T0 + 2)  # not T0 + 3: b holds one turn only
        assert limiter.acquire(spec, "b", held.retry_at, LEASE_S).admitted

    def test_a_rate_below_one_still_admits_one_start(self, limiter):
        spec = [LimitSpec("slow", rate_per_s=0.5)]
        first, second = limiter.acquire_many([(spec, "a"), (spec, "b")], T0, LEASE_S)
        assert first.admitted and not second.admitted
        assert second.retry_at == pytest.approx(T0 + 2.0)
        assert limiter.acquire(spec, "b", T0 + 2.0, LEASE_S).admitted

    def test_held_runs_get_spread_retry_times(self, limiter):
        spec = [LimitSpec("b", rate_per_s=5)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(50)], T0, LEASE_S)
        retry_at = [a.retry_at for a in answers if not a.admitted]
        assert len(retry_at) == 45 and len(set(retry_at)) == 45
        assert retry_at == sorted(retry_at)
        assert retry_at[0] == pytest.approx(T0 + 0.2)
        assert retry_at[-1] == pytest.approx(T0 + 9.0)
        assert all(b - a == pytest.approx(0.2) for a, b in pairwise(retry_at))

    def test_held_runs_that_come_back_on_time_are_admitted(self, limiter):
        spec = [LimitSpec("b", rate_per_s=5)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(20)], T0, LEASE_S)
        held = [(f"r{i}", a.retry_at) for i, a in enumerate(answers) if not a.admitted]
        assert all(limiter.acquire(spec, holder, at, LEASE_S).admitted for holder, at in held)

    def test_a_newcomer_queues_behind_the_held_runs(self, limiter):
        spec = [LimitSpec("b", rate_per_s=5)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(10)], T0, LEASE_S)
        last = max(a.retry_at for a in answers if not a.admitted)
        late = limiter.acquire(spec, "late", T0 + 0.1, LEASE_S)
        assert not late.admitted and late.retry_at == pytest.approx(last + 0.2)

    # -- concurrency cap ----------------------------------------------------------

    def test_a_cap_is_shared_by_limiters_and_a_release_frees_a_slot(self, pair):
        one, two = pair
        spec = [LimitSpec("c", max_concurrency=2)]
        assert one.acquire(spec, "a", T0, LEASE_S).admitted
        assert two.acquire(spec, "b", T0, LEASE_S).admitted
        held = two.acquire(spec, "c", T0 + 0.5, LEASE_S)
        assert not held.admitted and held.reason == "cap" and T0 + 0.5 < held.retry_at <= T0 + 0.5 + 1.0
        one.release(spec, "a")
        assert two.acquire(spec, "c", T0 + 0.6, LEASE_S).admitted
        assert not one.acquire(spec, "d", T0 + 0.7, LEASE_S).admitted

    def test_a_slot_comes_back_after_its_lease_when_never_released(self, pair):
        one, two = pair
        spec = [LimitSpec("c", max_concurrency=1)]
        assert one.acquire(spec, "dead-worker-run", T0, LEASE_S).admitted
        assert not two.acquire(spec, "b", T0 + LEASE_S - 1, LEASE_S).admitted
        assert two.acquire(spec, "b", T0 + LEASE_S + 0.001, LEASE_S).admitted

    def test_the_retry_time_behind_a_cap_is_no_later_than_the_first_lease_end(self, limiter):
        spec = [LimitSpec("c", max_concurrency=1)]
        assert limiter.acquire(spec, "a", T0, 0.3).admitted
        held = limiter.acquire(spec, "b", T0 + 0.1, LEASE_S)
        assert held.retry_at == pytest.approx(T0 + 0.3)

    def test_runs_behind_a_full_cap_take_nothing_and_are_not_spread(self, limiter):
        spec = [LimitSpec("c", max_concurrency=2)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(10)], T0, LEASE_S)
        held = [a for a in answers if not a.admitted]
        assert len(held) == 8 and {a.reason for a in held} == {"cap"}
        # A cap bounds calls in flight, not starts per second: no schedule is handed out.
        assert [a.retry_at for a in held] == pytest.approx([T0 + limiter.hold_s] * 8)
        limiter.release(spec, "r0")
        answers = limiter.acquire_many([(spec, "r2"), (spec, "r3")], T0 + 0.001, LEASE_S)
        assert admitted(answers) == [True, False]

    def test_a_cap_lets_the_next_run_in_as_soon_as_one_ends(self, limiter):
        spec = [LimitSpec("c", max_concurrency=4)]
        waiting = [f"r{i}" for i in range(80)]
        in_flight: list[str] = []
        now, peak = T0, 0
        while waiting:
            answers = limiter.acquire_many([(spec, h) for h in waiting], now, LEASE_S)
            in_flight += [h for h, a in zip(waiting, answers, strict=True) if a.admitted]
            waiting = [h for h, a in zip(waiting, answers, strict=True) if not a.admitted]
            peak = max(peak, len(in_flight))
            assert len(in_flight) == 4 or not waiting
            limiter.release(spec, in_flight.pop(0))  # one call ends: exactly one more starts
            now += 0.001
        assert peak == 4

    def test_free_slots_counts_the_live_leases_of_every_limiter(self, pair):
        one, two = pair
        spec = [LimitSpec("c", max_concurrency=3)]
        assert one.acquire(spec, "a", T0, LEASE_S).admitted
        assert two.acquire(spec, "b", T0, 5.0).admitted
        assert two.free_slots({"c": 3, "idle": 2}, T0 + 1) == {"c": 1, "idle": 2}
        assert one.free_slots({"c": 3}, T0 + 6) == {"c": 2}  # b's lease ran out
        one.release(spec, "a")
        assert one.free_slots({"c": 3}, T0 + 1) == {"c": 2}

    def test_renew_extends_a_lease(self, pair):
        one, two = pair
        spec = [LimitSpec("c", max_concurrency=1)]
        assert one.acquire(spec, "a", T0, LEASE_S).admitted
        one.renew(spec, "a", LEASE_S, now=T0 + 20)
        assert not two.acquire(spec, "b", T0 + LEASE_S + 5, LEASE_S).admitted
        assert two.acquire(spec, "b", T0 + 20 + LEASE_S + 0.001, LEASE_S).admitted

    def test_renew_after_release_takes_nothing_back(self, pair):
        one, two = pair
        spec = [LimitSpec("c", max_concurrency=1)]
        assert one.acquire(spec, "a", T0, LEASE_S).admitted
        one.release(spec, "a")
        one.renew(spec, "a", LEASE_S, now=T0 + 1)
        assert two.acquire(spec, "b", T0 + 2, LEASE_S).admitted

    def test_release_many_and_renew_many(self, limiter):
        spec = [LimitSpec("c", max_concurrency=3)]
        assert all(admitted(limiter.acquire_many([(spec, h) for h in "abc"], T0, LEASE_S)))
        limiter.renew_many([(spec, h) for h in "abc"], LEASE_S, now=T0 + 10)
        limiter.release_many([(spec, "a"), (spec, "b")])
        assert admitted(limiter.acquire_many([(spec, h) for h in "def"], T0 + 11, LEASE_S)) == [
            True,
            True,
            False,
        ]

    def test_releasing_what_is_not_held_is_harmless(self, limiter):
        spec = [LimitSpec("c", max_concurrency=1), LimitSpec("r", rate_per_s=1)]
        limiter.release(spec, "nobody")
        limiter.renew(spec, "nobody", LEASE_S, now=T0)
        assert limiter.acquire(spec, "a", T0, LEASE_S).admitted

    # -- the turns of a full cap (app.limits.line) --------------------------------

    def test_a_freed_slot_goes_to_the_owner_whose_turn_it_is_though_it_waits_in_another_line(self, pair):
        one, two = pair
        cap = [LimitSpec("c", max_concurrency=2)]
        a, b = Turn("a"), Turn("b")
        assert all(admitted(one.acquire_many([(cap, h, h, a) for h in ("a1", "a2")], T0, LEASE_S, "p1")))
        # A's runs wait in line p1, which handed A three slots from call to call; B's
        # one run waits in line p2: B starts level with the clock, ahead of A.
        one.look("p1", [Waiting("c", 2, {a: 5}, served={a: 3})], T0)
        seen = two.look("p2", [Waiting("c", 2, {b: 1})], T0)["c"]
        assert seen.free == 0 and seen.grants == {"ob": 0}
        assert [(x.flow, x.runs) for x in seen.ahead] == [("oa", 5)]
        one.release(cap, "a1")
        refused = one.acquire(cap, "a3", T0 + 0.1, LEASE_S, turn=a, line="p1")
        assert not refused.admitted and refused.reason == "cap"  # the free slot is B's
        assert two.look("p2", [Waiting("c", 2, {b: 1})], T0 + 0.1)["c"].grants == {"ob": 1}
        assert two.acquire(cap, "b1", T0 + 0.1, LEASE_S, turn=b, line="p2").admitted
        # B waits no more: A's runs take the next free slot.
        two.look("p2", [], T0 + 0.1)
        two.look("p2", [Waiting("c", 2, {})], T0 + 0.1)
        one.release(cap, "a2")
        assert one.acquire(cap, "a3", T0 + 0.2, LEASE_S, turn=a, line="p1").admitted

    def test_owners_waiting_in_several_lines_take_the_slots_by_weight_and_recurring_runs_first(self, pair):
        one, two = pair
        cap = [LimitSpec("c", max_concurrency=1)]
        heavy, light, tick = Turn("heavy", weight=2), Turn("light"), Turn("light", recurring=True)
        waiting = {"p1": {heavy: 50}, "p2": {light: 50}}
        limiters = {"p1": one, "p2": two}
        served: list[str] = []
        holder = "first"
        assert one.acquire(cap, holder, T0, LEASE_S).admitted
        for step in range(30):
            now = T0 + step * 0.01
            if step == 20:
                waiting["p1"][tick] = 2  # two occurrences of a recurring job come to wait
            limiters["p1"].release(cap, holder)
            for line in ("p1", "p2"):
                grants = limiters[line].look(line, [Waiting("c", 1, waiting[line])], now)["c"].grants
                for turn in waiting[line]:
                    if grants.get(turn.flow):
                        holder = f"{line}-{step}"
                        assert (
                            limiters[line].acquire(cap, holder, now, LEASE_S, turn=turn, line=line).admitted
                        )
                        waiting[line][turn] -= 1
                        served.append(turn.flow)
        assert served[20:22] == ["rlight", "rlight"]  # the recurring lane first
        first = served[:20]
        assert first.count("oheavy") in (13, 14) and first.count("olight") in (6, 7), first
        assert max(len(run) for run in "".join("h" if f == "oheavy" else "l" for f in first).split("l")) <= 2

    def test_the_asking_lines_own_waiting_runs_hold_no_slot_back_from_it(self, limiter):
        cap = [LimitSpec("c", max_concurrency=1)]
        a = Turn("a")
        limiter.look("p1", [Waiting("c", 1, {a: 5})], T0)
        limiter.look("p2", [Waiting("c", 1, {a: 5})], T0)  # the same owner elsewhere: not ahead of itself
        assert limiter.acquire(cap, "a1", T0, LEASE_S, turn=a, line="p1").admitted

    def test_a_lines_record_lapses_unless_it_looks_again(self, pair):
        one, two = pair
        cap = [LimitSpec("c", max_concurrency=1)]
        a, b = Turn("a"), Turn("b")
        one.look("p1", [Waiting("c", 1, {a: 1}, served={a: 1})], T0)
        two.look("p2", [Waiting("c", 1, {b: 1})], T0)  # a process that dies right after
        assert not one.acquire(cap, "a1", T0 + LINE_KEEP_S / 2, LEASE_S, turn=a, line="p1").admitted
        assert one.acquire(cap, "a1", T0 + LINE_KEEP_S + 0.01, LEASE_S, turn=a, line="p1").admitted

    def test_a_look_shows_the_flows_waiting_elsewhere_first_in_turn_first(self, pair):
        one, two = pair
        a, b, c, r = Turn("a"), Turn("b", weight=3), Turn("c"), Turn("c", recurring=True)
        one.look("p1", [Waiting("k", 4, {a: 2}, served={a: 4})], T0)
        one.look("p3", [Waiting("k", 4, {c: 1, r: 1})], T0)
        seen = two.look("p2", [Waiting("k", 4, {b: 7})], T0)["k"]
        assert seen.free == 4
        assert [(x.flow, x.weight, x.runs) for x in seen.ahead] == [
            ("rc", 1, 1),
            ("oc", 1, 0 + 1),
            ("oa", 1, 2),
        ]
        assert [x.start for x in seen.ahead] == [0.0, 3.0, 4.0]
        assert seen.tags.start("ob") == 3.0  # level with the one-off clock
        # Four free slots by turns: c's recurring run, then b (weight 3) and c from 3.0 on,
        # b twice for c's once... b gets two of them.
        assert seen.grants == {"ob": 2}

    # -- several specs: all or nothing -------------------------------------------

    def test_a_run_blocked_by_its_cap_takes_no_token(self, limiter):
        bucket, cap = LimitSpec("bucket", rate_per_s=1), LimitSpec("cap", max_concurrency=1)
        assert limiter.acquire([cap], "holder", T0, LEASE_S).admitted
        blocked = limiter.acquire([bucket, cap], "run", T0, LEASE_S)
        assert not blocked.admitted and blocked.reason == "cap"
        # The bucket's only token is still there.
        assert limiter.acquire([bucket], "other", T0, LEASE_S).admitted

    def test_a_run_blocked_by_its_bucket_takes_no_slot(self, limiter):
        bucket, cap = LimitSpec("bucket", rate_per_s=1), LimitSpec("cap", max_concurrency=2)
        assert limiter.acquire([bucket], "spender", T0, LEASE_S).admitted
        blocked = limiter.acquire([bucket, cap], "run", T0, LEASE_S)
        assert not blocked.admitted and blocked.reason == "rate" and blocked.retry_at == pytest.approx(T0 + 1)
        # Both slots of the cap are still free.
        assert all(admitted(limiter.acquire_many([([cap], "x"), ([cap], "y")], T0, LEASE_S)))

    def test_the_retry_time_is_when_every_spec_allows(self, limiter):
        fast, slow = LimitSpec("fast", rate_per_s=10), LimitSpec("slow", rate_per_s=1)
        assert limiter.acquire([fast, slow], "a", T0, LEASE_S).admitted
        held = limiter.acquire([fast, slow], "b", T0, LEASE_S)
        assert held.retry_at == pytest.approx(T0 + 1)

    def test_one_spec_in_one_run_one_in_another_within_a_batch(self, limiter):
        shared = LimitSpec("shared", rate_per_s=2)
        own = LimitSpec("own", max_concurrency=1)
        answers = limiter.acquire_many(
            [([shared, own], "a"), ([shared], "b"), ([shared, own], "c"), ([own], "d")], T0, LEASE_S
        )
        # a takes a token and the slot; b the second token; c has neither; d no slot.
        assert admitted(answers) == [True, True, False, False]

    # -- the interface ------------------------------------------------------------

    def test_runs_without_limits_are_admitted(self, limiter):
        answers = limiter.acquire_many(
            [([], "a"), ([LimitSpec("none")], "b"), ([LimitSpec("x", None, None)], "c")], T0, LEASE_S
        )
        assert admitted(answers) == [True, True, True]
        assert all(a.retry_at is None for a in answers)

    def test_now_may_be_a_datetime_and_retry_at_follows(self, limiter):
        now = datetime(2026, 12, 1, tzinfo=UTC)
        spec = [LimitSpec("b", rate_per_s=2)]
        answers = limiter.acquire_many([(spec, f"r{i}") for i in range(3)], now, LEASE_S)
        assert admitted(answers) == [True, True, False]
        assert answers[2].retry_at == now + timedelta(seconds=0.5)

    def test_concurrent_callers_never_exceed_a_cap(self, pair):
        spec = [LimitSpec("c", max_concurrency=3)]
        inside, peak, lock = [0], [0], threading.Lock()
        barrier = threading.Barrier(12)

        def worker(n: int) -> None:
            limiter = pair[n % 2]
            barrier.wait()
            for i in range(20):
                holder = f"w{n}-{i}"
                if limiter.acquire(spec, holder, T0, LEASE_S).admitted:
                    with lock:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                    with lock:
                        inside[0] -= 1
                    limiter.release(spec, holder)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert peak[0] in (1, 2, 3)  # never more than the cap, and the threads did overlap
