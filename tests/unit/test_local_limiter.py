"""LocalLimiter: the limiter contract in process memory (no I/O)."""

from __future__ import annotations

import pytest

from app.limits import LimitSpec, LocalLimiter, limiter_for
from app.settings import Settings
from tests.limiter_contract import LEASE_S, T0, LimiterContract, OnALoop


class TestLocalLimiter(LimiterContract):
    @pytest.fixture
    def pair(self):
        # Threads of one process share one LocalLimiter: the "two workers" are one.
        limiter = LocalLimiter()
        return limiter, limiter


class TestLocalLimiterOnALoop(LimiterContract):
    @pytest.fixture
    def pair(self):
        limiter = LocalLimiter()
        return OnALoop(limiter), limiter


def test_idle_keys_are_forgotten():
    limiter = LocalLimiter()
    for i in range(3000):
        spec = [LimitSpec(f"k{i}", rate_per_s=100, max_concurrency=5)]
        assert limiter.acquire(spec, "h", T0 + i, LEASE_S).admitted
        limiter.release(spec, "h")
    assert len(limiter._keys) < 1100


def test_busy_keys_are_kept():
    limiter = LocalLimiter()
    spec = [LimitSpec("busy", max_concurrency=1)]
    assert limiter.acquire(spec, "holder", T0, 10_000).admitted
    for i in range(2000):
        limiter.acquire([LimitSpec(f"k{i}", rate_per_s=100)], "h", T0 + i, LEASE_S)
    assert not limiter.acquire(spec, "other", T0 + 2001, LEASE_S).admitted


def test_limiter_for_without_redis_is_one_local_limiter_per_process():
    settings = Settings.from_env({})
    assert settings.redis_url == ""
    first = limiter_for(settings)
    assert isinstance(first, LocalLimiter)
    assert limiter_for(Settings.from_env({"PUNCTUAL_TARGET_RATE_PER_S": "5"})) is first
