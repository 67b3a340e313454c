"""RedisLimiter: the limiter contract on a real Redis, shared by two instances."""

from __future__ import annotations

import pytest
import redis

from app.limits import LimitSpec, RedisLimiter, limiter_for
from app.limits.limiter import TAGS_KEEP_S
from app.settings import Settings
from tests.conftest import REDIS_URL
from tests.limiter_contract import LEASE_S, T0, LimiterContract, OnALoop

pytestmark = pytest.mark.integration


@pytest.fixture
def client():
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


class TestRedisLimiter(LimiterContract):
    @pytest.fixture
    def pair(self, redis_prefix):
        # Two clients, two limiters: two worker processes as far as Redis can tell.
        limiters = (
            RedisLimiter.from_url(REDIS_URL, redis_prefix),
            RedisLimiter.from_url(REDIS_URL, redis_prefix),
        )
        yield limiters


class TestRedisLimiterOnALoop(LimiterContract):
    """The same contract through the forms the worker's loop uses (their own asyncio
    connection), against a limiter that answers the blocking forms."""

    @pytest.fixture
    def pair(self, redis_prefix):
        return (
            OnALoop(RedisLimiter.from_url(REDIS_URL, redis_prefix)),
            RedisLimiter.from_url(REDIS_URL, redis_prefix),
        )


class TestRedisLimiterOnALoopWithoutAURL(LimiterContract):
    """Made from a client, not a URL: the loop's forms run the blocking ones on a thread."""

    @pytest.fixture
    def pair(self, redis_prefix, client):
        return OnALoop(RedisLimiter(client, redis_prefix)), RedisLimiter(client, redis_prefix)


def test_a_batch_is_one_script_call(redis_prefix, monkeypatch):
    limiter = RedisLimiter.from_url(REDIS_URL, redis_prefix)
    calls = []
    script = limiter._admit
    monkeypatch.setattr(limiter, "_admit", lambda **kw: calls.append(kw) or script(**kw))
    spec = [LimitSpec("b", rate_per_s=5), LimitSpec("c", max_concurrency=100)]
    answers = limiter.acquire_many([(spec, f"r{i}") for i in range(500)] + [([], "free")], T0, LEASE_S)
    assert sum(a.admitted for a in answers) == 6
    assert len(calls) == 1
    limiter.acquire_many([([], "a"), ([LimitSpec("none")], "b")], T0, LEASE_S)
    assert len(calls) == 1  # nothing limited: no round trip at all


def test_keys_carry_the_prefix_and_expire(redis_prefix, client):
    limiter = RedisLimiter.from_url(REDIS_URL, redis_prefix)
    spec = [LimitSpec("owner:o:key:api", rate_per_s=5, max_concurrency=2)]
    for i in range(4):
        limiter.acquire(spec, f"r{i}", T0, LEASE_S)
    keys = sorted(k.decode() for k in client.scan_iter(match="*owner:o:key:api*"))
    assert keys == [
        f"{redis_prefix}:{kind}:owner:o:key:api" for kind in ("bucket", "slots", "tags")
    ]  # (no line waits for the cap: no line key)
    for key in keys[:2]:
        assert 0 < client.pttl(key) <= (LEASE_S + 120) * 1000
    assert 0 < client.pttl(keys[2]) <= (TAGS_KEEP_S + 120) * 1000


def test_the_script_survives_a_script_flush(redis_prefix, client):
    limiter = RedisLimiter.from_url(REDIS_URL, redis_prefix)
    spec = [LimitSpec("b", rate_per_s=1)]
    assert limiter.acquire(spec, "a", T0, LEASE_S).admitted
    client.script_flush()
    assert not limiter.acquire(spec, "b", T0, LEASE_S).admitted


def test_limiter_for_with_redis(redis_prefix):
    settings = Settings.from_env({"PUNCTUAL_REDIS_URL": REDIS_URL, "PUNCTUAL_REDIS_PREFIX": redis_prefix})
    limiter = limiter_for(settings)
    assert isinstance(limiter, RedisLimiter)
    assert limiter_for(settings) is limiter
    assert limiter.bucket_key("k") == f"{redis_prefix}:bucket:k"


def test_runs_of_several_spec_sets_are_answered_in_their_order(redis_prefix):
    # One script call carries each spec once and each run as a line naming its group:
    # runs of different groups, interleaved, still get their own answers, in order.
    limiter = RedisLimiter.from_url(REDIS_URL, redis_prefix)
    shared = LimitSpec("shared", max_concurrency=3)
    a, b = [shared, LimitSpec("a", max_concurrency=1)], [LimitSpec("b", rate_per_s=1), shared]
    answers = limiter.acquire_many(
        [(a, "a1"), (b, "b1", "job-b"), (a, "a2"), (b, "b2", "job-b2"), (b, "b3", "job-b3"), ([], "free")],
        T0,
        LEASE_S,
    )
    assert [(x.admitted, x.reason) for x in answers] == [
        (True, None),
        (True, None),
        (False, "cap"),  # "a" holds one slot
        (False, "rate"),  # one start a second under "b"
        (False, "rate"),
        (True, None),
    ]
    assert limiter.free_slots({"shared": 3, "a": 1}, T0) == {"shared": 1, "a": 0}


@pytest.mark.parametrize("holder", ["two words", "two\nlines"])
def test_an_id_that_would_split_a_line_is_refused(redis_prefix, holder):
    limiter = RedisLimiter.from_url(REDIS_URL, redis_prefix)
    with pytest.raises(ValueError, match="space or a line break"):
        limiter.acquire_many([([LimitSpec("k", max_concurrency=1)], holder)], T0, LEASE_S)
    assert limiter.free_slots({"k": 1}, T0) == {"k": 1}
