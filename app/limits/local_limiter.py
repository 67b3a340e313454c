"""The limiter in process memory, for `punctual dev` and any run without Redis.

Same contract and arithmetic as the Redis script (app.limits.limiter explains
both, app.limits.line the turns of a full cap); one lock guards all state, as the
script runs alone in Redis. Keys that have nothing left to remember (tat in the
past, no holders, no reservations, no line waiting) are swept now and then, so
memory follows the set of busy targets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from app.limits.limiter import (
    AHEAD_SHOWN,
    CAP,
    DEFAULT_HOLD_S,
    EARLY_S,
    LINE_KEEP_S,
    RATE,
    RESERVATION_KEEP_S,
    TAGS_PRUNED_PAST,
    Limited,
    Limiter,
    Look,
    Waiting,
    by_flow,
    rate_tolerance,
)
from app.limits.line import Ahead, Tags, Turn, allot
from app.limits.policy import LimitSpec

__all__ = ["LocalLimiter"]

_SWEEP_EVERY = 1024  # acquisitions between sweeps of idle keys


@dataclass
class _Key:
    tat: float = 0.0  # the rate's theoretical arrival time (0: never used)
    reservations: dict[str, float] = field(default_factory=dict)  # reserver -> reserved start
    holders: dict[str, float] = field(default_factory=dict)  # holder -> lease expiry
    tags: Tags = field(default_factory=Tags)  # the cap's turns
    # The lines with runs waiting for the cap: line -> (until when, flow -> (weight, runs)).
    lines: dict[str, tuple[float, dict[str, tuple[int, int]]]] = field(default_factory=dict)

    def live_holders(self, now: float) -> dict[str, float]:
        # Expired leases are gone whatever happens next: a dead worker's slots.
        self.holders = {h: exp for h, exp in self.holders.items() if exp > now}
        return self.holders

    def elsewhere(self, line: str, now: float) -> list[Ahead]:
        """The flows waiting in lines other than `line` (records out of date dropped)."""
        self.lines = {name: record for name, record in self.lines.items() if record[0] > now}
        flows: dict[str, tuple[int, int]] = {}
        for name, (_, waiting) in self.lines.items():
            if name != line:
                for flow, (weight, runs) in waiting.items():
                    before = flows.get(flow, (weight, 0))
                    flows[flow] = (max(weight, before[0]), before[1] + runs)
        return [Ahead(flow, self.tags.start(flow), weight, runs) for flow, (weight, runs) in flows.items()]

    def charge(self, served: dict[str, tuple[int, int]]) -> None:
        self.tags.charge(served)
        if len(self.tags.finish) > TAGS_PRUNED_PAST:
            self.tags.forget_level()


class LocalLimiter(Limiter):
    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        super().__init__(hold_s)
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()
        self._since_sweep = 0

    def _acquire(self, requests, now, lease_s, line):
        with self._lock:
            grants = self._grants(requests, now, line)
            served: dict[str, dict[str, tuple[int, int]]] = {}
            answers = [
                self._admit(specs, holder, reserver, turn, now, lease_s, grants, served)
                for specs, holder, reserver, turn in requests
            ]
            for key, flows in served.items():
                self._keys[key].charge(flows)
            self._since_sweep += len(requests)
            if self._since_sweep >= _SWEEP_EVERY:
                self._sweep(now)
            return answers

    def _grants(self, requests: list[Limited], now: float, line: str) -> dict[str, dict[str, int]]:
        """For each cap whose free slots the turns share out (more runs ask for it than it
        has free, or flows wait for it in other lines): how many of the batch's runs of
        each flow may take one."""
        asking: dict[str, dict[str, tuple[int, int]]] = {}
        caps: dict[str, int] = {}
        for specs, _, _, turn in requests:
            for spec in specs:
                if spec.max_concurrency:
                    caps[spec.key] = spec.max_concurrency
                    flows = asking.setdefault(spec.key, {})
                    weight, runs = flows.get(turn.flow, (turn.weight, 0))
                    flows[turn.flow] = (weight, runs + 1)
        grants = {}
        for key, flows in asking.items():
            state = self._keys.setdefault(key, _Key())
            free = caps[key] - len(state.live_holders(now))
            if free <= 0:
                continue  # full: every run is refused anyway
            elsewhere = state.elsewhere(line, now)
            if any(a.flow not in flows for a in elsewhere) or sum(r for _, r in flows.values()) > free:
                grants[key] = allot(free, flows, elsewhere, state.tags)
        return grants

    def _admit(
        self,
        specs: tuple[LimitSpec, ...],
        holder: str,
        reserver: str,
        turn: Turn,
        now: float,
        lease_s: float,
        grants: dict[str, dict[str, int]],
        served: dict[str, dict[str, tuple[int, int]]],
    ) -> tuple[str, float] | None:
        # First look at every spec without changing anything...
        looks = []
        rate_at = cap_at = None
        for spec in specs:
            state = self._keys.setdefault(spec.key, _Key())
            reserved = new_wait = None
            if spec.rate_per_s:
                reserved = state.reservations.get(reserver)
                if reserved is not None and reserved < now - RESERVATION_KEEP_S:
                    del state.reservations[reserver]
                    reserved = None
                if reserved is not None:
                    if reserved > now + EARLY_S:  # came back early: its turn is still reserved
                        rate_at = max(rate_at or 0.0, reserved)
                else:
                    conforming_at = state.tat - rate_tolerance(spec.rate_per_s)
                    if conforming_at > now + EARLY_S:
                        new_wait = conforming_at
            if spec.max_concurrency:
                holders = state.live_holders(now)
                shared = grants.get(spec.key)
                if holder not in holders and (
                    len(holders) >= spec.max_concurrency or (shared is not None and shared[turn.flow] <= 0)
                ):
                    first_end = min(holders.values(), default=now + self.hold_s)
                    cap_at = min(cap_at or first_end, first_end, now + self.hold_s)
            looks.append((spec, state, reserved, new_wait))
        # ...then reserve future starts, or wait for a slot, or take from every spec.
        if rate_at is not None or any(new_wait is not None for _, _, _, new_wait in looks):
            retry_at = rate_at or 0.0
            for spec, state, _, new_wait in looks:
                if new_wait is not None:
                    assert spec.rate_per_s  # only a rate makes a rate wait
                    state.reservations[reserver] = new_wait
                    state.tat += 1 / spec.rate_per_s
                    retry_at = max(retry_at, new_wait)
            return RATE, retry_at
        if cap_at is not None:
            return CAP, cap_at
        for spec, state, reserved, _ in looks:
            if spec.rate_per_s:
                if reserved is not None:
                    del state.reservations[reserver]
                else:
                    state.tat = max(state.tat, now) + 1 / spec.rate_per_s
            if spec.max_concurrency:
                state.holders[holder] = now + lease_s
                if spec.key in grants:
                    grants[spec.key][turn.flow] -= 1
                flows = served.setdefault(spec.key, {})
                flows[turn.flow] = (turn.weight, flows.get(turn.flow, (0, 0))[1] + 1)
        return None

    def _look(self, line, waiting, now):
        with self._lock:
            return {item.key: self._look_at(line, item, now) for item in waiting}

    def _look_at(self, line: str, item: Waiting, now: float) -> Look:
        state = self._keys.setdefault(item.key, _Key())
        free = max(0, item.max_concurrency - len(state.live_holders(now)))
        served = by_flow(item.served)
        if served:
            state.charge(served)
        here = by_flow(item.runs)
        if here:
            state.lines[line] = (now + LINE_KEEP_S, here)
        else:
            state.lines.pop(line, None)
        elsewhere = state.elsewhere(line, now)
        ahead = sorted((a for a in elsewhere if a.flow not in here), key=Ahead.order)[:AHEAD_SHOWN]
        finish = state.tags.finish
        shown = Tags(dict(state.tags.clock), {flow: finish[flow] for flow in here if flow in finish})
        return Look(free, allot(free, here, elsewhere, state.tags), shown, tuple(ahead))

    def _held(self, keys, now):
        with self._lock:
            states = [self._keys.get(key) for key in keys]
            return [
                sum(1 for expiry in state.holders.values() if expiry > now) if state else 0
                for state in states
            ]

    def _release(self, items):
        with self._lock:
            for key, holder in items:
                state = self._keys.get(key)
                if state is not None:
                    state.holders.pop(holder, None)

    def _renew(self, items, now, lease_s):
        with self._lock:
            for key, holder in items:
                state = self._keys.get(key)
                if state is not None and holder in state.holders:
                    state.holders[holder] = max(state.holders[holder], now + lease_s)

    # In memory, under a lock held for microseconds: a loop's caller is answered at once.

    async def _acquire_async(self, requests, now, lease_s, line):
        return self._acquire(requests, now, lease_s, line)

    async def _look_async(self, line, waiting, now):
        return self._look(line, waiting, now)

    async def _release_async(self, items):
        self._release(items)

    async def _held_async(self, keys, now):
        return self._held(keys, now)

    def _sweep(self, now: float) -> None:
        self._since_sweep = 0
        for state in self._keys.values():
            if state.reservations:
                state.reservations = {
                    r: at for r, at in state.reservations.items() if at >= now - RESERVATION_KEEP_S
                }
        idle = [
            key
            for key, s in self._keys.items()
            if s.tat <= now
            and not s.reservations
            and not any(expiry > now for expiry in s.holders.values())
            and not any(until > now for until, _ in s.lines.values())
        ]
        for key in idle:
            del self._keys[key]
