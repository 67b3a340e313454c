"""The limiter in process memory, for `punctual dev` and any run without Redis.

Same contract and arithmetic as the Redis script (app.limits.limiter explains
both); one lock guards all state, as the script runs alone in Redis. Keys that
have nothing left to remember (a full bucket, no holders, no pending spread) are
swept now and then, so memory follows the set of busy targets.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from app.limits.limiter import DEFAULT_HOLD_S, EARLY_S, Limiter
from app.limits.policy import LimitSpec

__all__ = ["LocalLimiter"]

_SWEEP_EVERY = 1024  # acquisitions between sweeps of idle keys


@dataclass
class _Key:
    tokens: float | None = None  # None: a full bucket (never used, or swept)
    ts: float = 0.0  # when `tokens` was true
    full_at: float = 0.0  # when the bucket is full again (then it may be forgotten)
    rate_next: float = 0.0  # the next retry time to hand out behind the bucket
    slot_next: float = 0.0  # the next retry time to hand out behind the cap
    holders: dict[str, float] = field(default_factory=dict)  # holder -> lease expiry


class LocalLimiter(Limiter):
    def __init__(self, hold_s: float = DEFAULT_HOLD_S):
        super().__init__(hold_s)
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()
        self._since_sweep = 0

    def _acquire(self, requests, now, lease_s):
        with self._lock:
            answers = [self._admit(specs, holder, now, lease_s) for specs, holder in requests]
            self._since_sweep += len(requests)
            if self._since_sweep >= _SWEEP_EVERY:
                self._sweep(now)
            return answers

    def _admit(self, specs: tuple[LimitSpec, ...], holder: str, now: float, lease_s: float) -> float | None:
        # First look at every spec without changing anything that matters...
        looks = []
        blocked = False
        for spec in specs:
            state = self._keys.setdefault(spec.key, _Key())
            tokens = ts = rate_wait = slot_wait = None
            if spec.rate_per_s:
                rate = spec.rate_per_s
                burst = max(rate, 1.0)
                tokens, ts = (burst, now) if state.tokens is None else (state.tokens, state.ts)
                if now > ts:
                    tokens, ts = min(burst, tokens + (now - ts) * rate), now
                if tokens + rate * EARLY_S < 1:
                    rate_wait = max(ts + (1 - tokens) / rate, state.rate_next)
            if spec.max_concurrency:
                # Expired leases are gone whatever happens next: a dead worker's slots.
                state.holders = {h: exp for h, exp in state.holders.items() if exp > now}
                if holder not in state.holders and len(state.holders) >= spec.max_concurrency:
                    free_at = min(min(state.holders.values()), now + self.hold_s)
                    slot_wait = max(free_at, state.slot_next)
            blocked = blocked or rate_wait is not None or slot_wait is not None
            looks.append((spec, state, tokens, ts, rate_wait, slot_wait))
        # ...then either take from all of them, or only move the spread hints on.
        if blocked:
            retry_at = 0.0
            for spec, state, _, _, rate_wait, slot_wait in looks:
                if rate_wait is not None:
                    assert spec.rate_per_s  # only a rate makes a rate wait
                    state.rate_next = rate_wait + 1 / spec.rate_per_s
                    retry_at = max(retry_at, rate_wait)
                if slot_wait is not None:
                    assert spec.max_concurrency  # only a cap makes a slot wait
                    state.slot_next = slot_wait + self.hold_s / spec.max_concurrency
                    retry_at = max(retry_at, slot_wait)
            return retry_at
        for spec, state, tokens, ts, _, _ in looks:
            if spec.rate_per_s:
                assert tokens is not None and ts is not None  # the look above set both for a rate
                state.tokens, state.ts = tokens - 1, ts
                state.full_at = ts + (max(spec.rate_per_s, 1.0) - state.tokens) / spec.rate_per_s
            if spec.max_concurrency:
                state.holders[holder] = now + lease_s
        return None

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

    def _sweep(self, now: float) -> None:
        self._since_sweep = 0
        idle = [
            key for key, s in self._keys.items()
            if s.full_at <= now and s.rate_next <= now and s.slot_next <= now
            and not any(expiry > now for expiry in s.holders.values())
        ]
        for key in idle:
            del self._keys[key]
