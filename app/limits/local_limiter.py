"""The limiter in process memory, for `punctual dev` and any run without Redis.

Same contract and arithmetic as the Redis script (app.limits.limiter explains
both); one lock guards all state, as the script runs alone in Redis. Keys that
have nothing left to remember (tat in the past, no holders, no reservations) are
swept now and then, so memory follows the set of busy targets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from app.limits.limiter import CAP, DEFAULT_HOLD_S, EARLY_S, RATE, RESERVATION_KEEP_S, Limiter, rate_tolerance
from app.limits.policy import LimitSpec

__all__ = ["LocalLimiter"]

_SWEEP_EVERY = 1024  # acquisitions between sweeps of idle keys


@dataclass
class _Key:
    tat: float = 0.0  # the rate's theoretical arrival time (0: never used)
    reservations: dict[str, float] = field(default_factory=dict)  # reserver -> reserved start
    holders: dict[str, float] = field(default_factory=dict)  # holder -> lease expiry


class LocalLimiter(Limiter):
    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        super().__init__(hold_s)
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()
        self._since_sweep = 0

    def _acquire(self, requests, now, lease_s):
        with self._lock:
            answers = [
                self._admit(specs, holder, reserver, now, lease_s) for specs, holder, reserver in requests
            ]
            self._since_sweep += len(requests)
            if self._since_sweep >= _SWEEP_EVERY:
                self._sweep(now)
            return answers

    def _admit(
        self, specs: tuple[LimitSpec, ...], holder: str, reserver: str, now: float, lease_s: float
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
                # Expired leases are gone whatever happens next: a dead worker's slots.
                state.holders = {h: exp for h, exp in state.holders.items() if exp > now}
                if holder not in state.holders and len(state.holders) >= spec.max_concurrency:
                    first_end = min(state.holders.values())
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
        return None

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

    async def _acquire_async(self, requests, now, lease_s):
        return self._acquire(requests, now, lease_s)

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
            if s.tat <= now and not s.reservations and not any(expiry > now for expiry in s.holders.values())
        ]
        for key in idle:
            del self._keys[key]
