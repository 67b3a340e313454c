"""The limiter on Redis: shared by every worker, one round trip per batch.

All of admission is the one Lua script below (contract: app.limits.limiter).
Per spec key K there are two Redis keys:

- `<prefix>:bucket:K`, a hash: `tokens` and `ts` (the bucket as of `ts`; absent =
  full), `full_at` (when it is full again), `rate_next` / `slot_next` (the next
  retry time to hand out to a run held behind the bucket / the cap);
- `<prefix>:slots:K`, a sorted set: holder -> lease expiry (unix seconds).

Both expire once they hold nothing worth remembering. Release and renew touch only
the sorted sets and need no script: a pipeline of ZREM / ZADD XX GT.
"""
from __future__ import annotations

import redis

from app.limits.limiter import DEFAULT_HOLD_S, EARLY_S, Limiter

__all__ = ["RedisLimiter", "ADMIT_SCRIPT"]

# Seconds a key outlives the last thing it has to remember.
_KEY_GRACE_S = 60

ADMIT_SCRIPT = r"""
-- Admit a batch of runs, each all-or-nothing across its limit specs.
--
-- ARGV: now, lease_s, hold_s, n_runs, then per run: holder, n_specs, and per spec:
--       rate_per_s (0 = no bucket), max_concurrency (0 = no cap)
-- KEYS: per spec of each run, in the same order: bucket hash, slots sorted set
-- Returns one string per run: "ok" (admitted: a token taken from every bucket and a
-- slot held until now + lease_s in every cap), or the earliest time it may start
-- (nothing taken; only the spread hints moved on).
--
-- Bucket: holds max(rate, 1) tokens, refilled continuously at `rate`; a start
-- takes one (a token due within `early` seconds counts: float time is not exact).
-- Cap: holders whose lease expired are dropped first (a dead worker's slots come
-- back). Spread: a run held behind a bucket gets the later of "when the next token
-- exists" and `rate_next`, and `rate_next` moves 1/rate further, so held runs come
-- back one token interval apart; behind a cap likewise with
-- hold_s / max_concurrency. Times are the caller's (workers share NTP time).
local now = tonumber(ARGV[1])
local lease_s = tonumber(ARGV[2])
local hold_s = tonumber(ARGV[3])
local n_runs = tonumber(ARGV[4])
local grace = __GRACE__
local early = __EARLY__
local a, k = 5, 1
local answers = {}

local function keep_for(key, seconds)
  redis.call('PEXPIRE', key, math.ceil((math.max(seconds, 0) + grace) * 1000))
end

for r = 1, n_runs do
  local holder, n_specs = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local looks, blocked = {}, false
  for s = 1, n_specs do
    local L = {bucket = KEYS[k], slots = KEYS[k + 1], rate = tonumber(ARGV[a]), cap = tonumber(ARGV[a + 1])}
    k, a = k + 2, a + 2
    local h = redis.call('HMGET', L.bucket, 'tokens', 'ts', 'full_at', 'rate_next', 'slot_next')
    L.full_at, L.rate_next, L.slot_next = tonumber(h[3]) or 0, tonumber(h[4]) or 0, tonumber(h[5]) or 0
    if L.rate > 0 then
      local burst = math.max(L.rate, 1)
      L.tokens, L.ts = tonumber(h[1]) or burst, tonumber(h[2]) or now
      if now > L.ts then
        L.tokens, L.ts = math.min(burst, L.tokens + (now - L.ts) * L.rate), now
      end
      if L.tokens + L.rate * early < 1 then
        L.rate_wait = math.max(L.ts + (1 - L.tokens) / L.rate, L.rate_next)
        blocked = true
      end
    end
    if L.cap > 0 then
      redis.call('ZREMRANGEBYSCORE', L.slots, '-inf', now)
      if not redis.call('ZSCORE', L.slots, holder) and redis.call('ZCARD', L.slots) >= L.cap then
        local first = redis.call('ZRANGE', L.slots, 0, 0, 'WITHSCORES')
        L.slot_wait = math.max(math.min(tonumber(first[2]), now + hold_s), L.slot_next)
        blocked = true
      end
    end
    looks[s] = L
  end

  if blocked then
    local retry_at = 0
    for s = 1, n_specs do
      local L = looks[s]
      if L.rate_wait then
        L.rate_next = L.rate_wait + 1 / L.rate
        redis.call('HSET', L.bucket, 'rate_next', L.rate_next)
        retry_at = math.max(retry_at, L.rate_wait)
      end
      if L.slot_wait then
        L.slot_next = L.slot_wait + hold_s / L.cap
        redis.call('HSET', L.bucket, 'slot_next', L.slot_next)
        retry_at = math.max(retry_at, L.slot_wait)
      end
      if L.rate_wait or L.slot_wait then
        keep_for(L.bucket, math.max(L.full_at, L.rate_next, L.slot_next) - now)
      end
    end
    -- Rounded up: a run that comes back at this instant finds its token there.
    answers[r] = string.format('%.6f', math.ceil(retry_at * 1e6) / 1e6)
  else
    for s = 1, n_specs do
      local L = looks[s]
      if L.rate > 0 then
        L.tokens = L.tokens - 1
        L.full_at = L.ts + (math.max(L.rate, 1) - L.tokens) / L.rate
        redis.call('HSET', L.bucket, 'tokens', L.tokens, 'ts', L.ts, 'full_at', L.full_at)
        keep_for(L.bucket, math.max(L.full_at, L.rate_next, L.slot_next) - now)
      end
      if L.cap > 0 then
        redis.call('ZADD', L.slots, now + lease_s, holder)
        if redis.call('PTTL', L.slots) < (lease_s + grace) * 1000 then
          keep_for(L.slots, lease_s)
        end
      end
    end
    answers[r] = 'ok'
  end
end
return answers
""".replace("__GRACE__", str(_KEY_GRACE_S)).replace("__EARLY__", repr(EARLY_S))


class RedisLimiter(Limiter):
    """Limits shared by every process that uses the same Redis and key prefix."""

    def __init__(self, client: redis.Redis, prefix: str, hold_s: float = DEFAULT_HOLD_S):
        super().__init__(hold_s)
        self._client = client
        self._prefix = prefix
        # register_script: EVALSHA, loading the script again if Redis lost it.
        self._admit = client.register_script(ADMIT_SCRIPT)

    @classmethod
    def from_url(cls, url: str, prefix: str, hold_s: float = DEFAULT_HOLD_S) -> "RedisLimiter":
        return cls(redis.Redis.from_url(url), prefix, hold_s)

    def bucket_key(self, key: str) -> str:
        return f"{self._prefix}:bucket:{key}"

    def slots_key(self, key: str) -> str:
        return f"{self._prefix}:slots:{key}"

    def _acquire(self, requests, now, lease_s):
        keys: list[str] = []
        args: list[str | int | float] = [now, lease_s, self.hold_s, len(requests)]
        for specs, holder in requests:
            args += [holder, len(specs)]
            for spec in specs:
                keys += [self.bucket_key(spec.key), self.slots_key(spec.key)]
                args += [spec.rate_per_s or 0, spec.max_concurrency or 0]
        answers = self._admit(keys=keys, args=args)
        return [None if answer in (b"ok", "ok") else float(answer) for answer in answers]

    def _release(self, items):
        pipe = self._client.pipeline(transaction=False)
        for key, holder in items:
            pipe.zrem(self.slots_key(key), holder)
        pipe.execute()

    def _renew(self, items, now, lease_s):
        pipe = self._client.pipeline(transaction=False)
        for key, holder in items:
            # XX: a slot that already expired is not taken back behind others' backs.
            # GT: never shorten a lease.
            pipe.zadd(self.slots_key(key), {holder: now + lease_s}, xx=True, gt=True)
            pipe.expire(self.slots_key(key), int(lease_s + _KEY_GRACE_S) + 1, gt=True)
        pipe.execute()
