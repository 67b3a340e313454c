"""The limiter on Redis: shared by every worker, one round trip per batch.

All of admission is the one Lua script below (contract: app.limits.limiter).
Per spec key K there are three Redis keys:

- `<prefix>:bucket:K`, a hash: `tat`, the rate's theoretical arrival time;
- `<prefix>:resv:K`, a sorted set: reserver -> the start reserved for it;
- `<prefix>:slots:K`, a sorted set: holder -> lease expiry (unix seconds).

Each expires once it holds nothing worth remembering. Release and renew touch only
the slots and need no script: a pipeline of ZREM / ZADD XX GT.

The forms for a caller on an event loop (`acquire_many_async`, ...) send the same
commands over a connection of that loop's own (redis.asyncio, made on first use in
each loop), when the limiter was made from a URL.
"""

from __future__ import annotations

import asyncio
import weakref

import redis
import redis.asyncio
from redis.commands.core import AsyncScript

from app.limits.limiter import CAP, DEFAULT_HOLD_S, EARLY_S, RATE, RESERVATION_KEEP_S, Limiter

__all__ = ["RedisLimiter", "ADMIT_SCRIPT"]

# Seconds a key outlives the last thing it has to remember.
_KEY_GRACE_S = 60

ADMIT_SCRIPT = (
    r"""
-- Admit a batch of runs, each all-or-nothing across its limit specs.
--
-- KEYS: per spec key of the batch, once: bucket hash, slots sorted set, reservations
--       sorted set
-- ARGV: now, lease_s, hold_s; n_keys, then per key: rate_per_s (0 = no rate),
--       max_concurrency (0 = no cap); n_groups, then per group (the specs some runs
--       share): n_specs, then the number of each of its keys; last, the runs as one
--       text, a line "<group> <holder> <reserver>" per run, in order
-- Returns one text, a word per run in order: "ok" (admitted: its rate start taken or
-- its reservation used, a slot held until now + lease_s in every cap), "r<t>" (held
-- by a rate: a start is reserved for it at t, nothing else taken) or "c<t>" (every
-- slot of a cap taken: nothing taken; t is a hint).
--
-- A batch's runs mostly share their specs, so keys and limits travel once and a run
-- costs one line: the client's encoding of eight arguments a run, and of an answer
-- each, was most of what an admission cost the worker.
--
-- Rate: a GCRA. A start conforms when tat - tolerance <= now (tolerance: one second
-- of burst) and moves tat on by 1/rate; a run that does not conform reserves the next
-- conforming instant, which moves tat on as a start would, so a held run is held once.
-- Cap: holders whose lease expired are dropped first (a dead worker's slots come back).
-- Each key is read once per call and written once at its end. Times are the caller's
-- (workers share NTP time), written with 17 digits (Lua's own tostring keeps 14).
local now = tonumber(ARGV[1])
local lease_s = tonumber(ARGV[2])
local hold_s = tonumber(ARGV[3])
local n_keys = tonumber(ARGV[4])
local grace = __GRACE__
local early = __EARLY__
local keep = __KEEP__
local answers = {}
local seen, order = {}, {}
local a = 5
local limits = {}
for j = 1, n_keys do
  limits[j] = {tonumber(ARGV[a]), tonumber(ARGV[a + 1])}
  a = a + 2
end
local groups = {}
for g = 1, tonumber(ARGV[a]) do
  a = a + 1
  local members = {}
  for s = 1, tonumber(ARGV[a]) do
    members[s] = tonumber(ARGV[a + s])
  end
  a = a + #members
  groups[g] = members
end
local runs = ARGV[a + 1]

local function fmt(x)
  return string.format('%.17g', x)
end

local function keep_for(key, seconds)
  redis.call('PEXPIRE', key, math.ceil((math.max(seconds, 0) + grace) * 1000))
end

local function load(j)
  local S = seen[j]
  if S then return S end
  local rate, cap = limits[j][1], limits[j][2]
  S = {bucket = KEYS[3 * j - 2], slots = KEYS[3 * j - 1], resv = KEYS[3 * j], rate = rate, cap = cap}
  if rate > 0 then
    S.tat = tonumber(redis.call('HGET', S.bucket, 'tat')) or 0
    S.tat0 = S.tat
    S.tolerance = (math.max(rate, 1) - 1) / rate
    redis.call('ZREMRANGEBYSCORE', S.resv, '-inf', '(' .. fmt(now - keep))
    S.n_resv = redis.call('ZCARD', S.resv)
  end
  if cap > 0 then
    redis.call('ZREMRANGEBYSCORE', S.slots, '-inf', fmt(now))
    S.count = redis.call('ZCARD', S.slots)
  end
  seen[j] = S
  order[#order + 1] = S
  return S
end

local r = 0
for group, holder, reserver in string.gmatch(runs, '(%d+) ([^ \n]+) ([^ \n]+)') do
  r = r + 1
  local members = groups[tonumber(group)]
  local n_specs = #members
  local looks, rate_at, cap_at, new_rate = {}, nil, nil, false
  for s = 1, n_specs do
    local S = load(members[s])
    local L = {S = S}
    if S.rate > 0 then
      local reserved = S.n_resv > 0 and redis.call('ZSCORE', S.resv, reserver)
      if reserved then
        L.reserved = tonumber(reserved)
        if L.reserved > now + early then rate_at = math.max(rate_at or 0, L.reserved) end
      elseif S.tat - S.tolerance > now + early then
        L.wait = S.tat - S.tolerance
        new_rate = true
      end
    end
    if S.cap > 0 and S.count >= S.cap and not redis.call('ZSCORE', S.slots, holder) then
      if not S.first then
        S.first = tonumber(redis.call('ZRANGE', S.slots, 0, 0, 'WITHSCORES')[2])
      end
      local at = math.min(S.first, now + hold_s)
      cap_at = math.min(cap_at or at, at)
    end
    looks[s] = L
  end

  if rate_at or new_rate then
    local retry_at = rate_at or 0
    for s = 1, n_specs do
      local L = looks[s]
      if L.wait then
        local S = L.S
        redis.call('ZADD', S.resv, fmt(L.wait), reserver)
        S.n_resv = S.n_resv + 1
        S.tat = S.tat + 1 / S.rate
        S.resv_until = math.max(S.resv_until or 0, L.wait)
        retry_at = math.max(retry_at, L.wait)
      end
    end
    -- Rounded up: a run that comes back at this instant finds its turn come.
    answers[r] = 'r' .. string.format('%.6f', math.ceil(retry_at * 1e6) / 1e6)
  elseif cap_at then
    answers[r] = 'c' .. string.format('%.6f', math.ceil(cap_at * 1e6) / 1e6)
  else
    for s = 1, n_specs do
      local L = looks[s]
      local S = L.S
      if S.rate > 0 then
        if L.reserved then
          redis.call('ZREM', S.resv, reserver)
        else
          S.tat = math.max(S.tat, now) + 1 / S.rate
        end
      end
      if S.cap > 0 then
        S.count = S.count + redis.call('ZADD', S.slots, fmt(now + lease_s), holder)
        S.added = true
      end
    end
    answers[r] = 'ok'
  end
end

for _, S in ipairs(order) do
  if S.rate > 0 and S.tat ~= S.tat0 then
    redis.call('HSET', S.bucket, 'tat', fmt(S.tat))
    keep_for(S.bucket, S.tat - now)
  end
  if S.resv_until then
    keep_for(S.resv, S.resv_until - now + keep)
  end
  if S.added and redis.call('PTTL', S.slots) < (lease_s + grace) * 1000 then
    keep_for(S.slots, lease_s)
  end
end
return table.concat(answers, ' ')
""".replace("__GRACE__", str(_KEY_GRACE_S))
    .replace("__EARLY__", repr(EARLY_S))
    .replace("__KEEP__", repr(RESERVATION_KEEP_S))
)

_REASONS = {"r": RATE, "c": CAP}


class RedisLimiter(Limiter):
    """Limits shared by every process that uses the same Redis and key prefix."""

    def __init__(
        self, client: redis.Redis, prefix: str, hold_s: float = DEFAULT_HOLD_S, url: str | None = None
    ):
        """`url`: where an event loop's own connection goes (the `*_async` forms); without
        it, those forms run the blocking ones on a thread."""
        super().__init__(hold_s)
        self._client = client
        self._prefix = prefix
        # register_script: EVALSHA, loading the script again if Redis lost it.
        self._admit = client.register_script(ADMIT_SCRIPT)
        self._keys: dict[str, tuple[str, str, str]] = {}  # spec key -> its three Redis keys
        self._url = url
        # Per event loop: its client and the admission script on it (a connection
        # belongs to the loop that made it).
        self._on_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_url(cls, url: str, prefix: str, hold_s: float = DEFAULT_HOLD_S) -> RedisLimiter:
        return cls(redis.Redis.from_url(url), prefix, hold_s, url)

    def _on_loop(self) -> tuple[redis.asyncio.Redis, AsyncScript]:
        """This event loop's client and admission script."""
        loop = asyncio.get_running_loop()
        found = self._on_loops.get(loop)
        if found is None:
            assert self._url is not None
            client = redis.asyncio.Redis.from_url(self._url)
            found = self._on_loops[loop] = (client, client.register_script(ADMIT_SCRIPT))
        return found

    async def aclose(self) -> None:
        found = self._on_loops.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[0].aclose()

    def bucket_key(self, key: str) -> str:
        return f"{self._prefix}:bucket:{key}"

    def slots_key(self, key: str) -> str:
        return f"{self._prefix}:slots:{key}"

    def reservations_key(self, key: str) -> str:
        return f"{self._prefix}:resv:{key}"

    def _redis_keys(self, key: str) -> tuple[str, str, str]:
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) > 10_000:  # keys of targets long gone
                self._keys.clear()
            found = self._keys[key] = (self.bucket_key(key), self.slots_key(key), self.reservations_key(key))
        return found

    def _acquire(self, requests, now, lease_s):
        keys, args = self._admission(requests, now, lease_s)
        return _answers(self._admit(keys=keys, args=args), len(requests))

    async def _acquire_async(self, requests, now, lease_s):
        if self._url is None:
            return await super()._acquire_async(requests, now, lease_s)
        keys, args = self._admission(requests, now, lease_s)
        _, script = self._on_loop()
        return _answers(await script(keys=keys, args=args), len(requests))

    def _admission(self, requests, now, lease_s) -> tuple[list[str], list]:
        """The admission script's KEYS and ARGV for `requests`."""
        numbers: dict[str, int] = {}  # spec key -> its number in the script (from 1)
        keys: list[str] = []
        limits: list[float | int] = []
        groups: dict[tuple[int, ...], int] = {}  # the numbers of a run's keys -> its group
        lines = []
        for specs, holder, reserver in requests:
            members = []
            for spec in specs:
                number = numbers.get(spec.key)
                if number is None:
                    number = numbers[spec.key] = len(numbers) + 1
                    keys += self._redis_keys(spec.key)
                    limits += [spec.rate_per_s or 0, spec.max_concurrency or 0]
                members.append(number)
            group = groups.setdefault(tuple(members), len(groups) + 1)
            lines.append(f"{group} {holder} {reserver}")
        runs = "\n".join(lines)
        # A line is three words: a holder or reserver id with a space or a line break
        # in it would be read as another run.
        if runs.count(" ") != 2 * len(lines) or runs.count("\n") != len(lines) - 1:
            raise ValueError("a holder or reserver id holds a space or a line break")
        args: list[str | int | float] = [now, lease_s, self.hold_s, len(numbers), *limits, len(groups)]
        for members_of_group in groups:
            args += [len(members_of_group), *members_of_group]
        args.append(runs)
        return keys, args

    def _held(self, keys, now):
        pipe = self._client.pipeline(transaction=False)
        self._count_held(pipe, keys, now)
        return [int(count) for count in pipe.execute()]

    async def _held_async(self, keys, now):
        if self._url is None:
            return await super()._held_async(keys, now)
        client, _ = self._on_loop()
        pipe = client.pipeline(transaction=False)
        self._count_held(pipe, keys, now)
        return [int(count) for count in await pipe.execute()]

    def _count_held(self, pipe, keys, now) -> None:
        for key in keys:
            pipe.zcount(self.slots_key(key), f"({now!r}", "+inf")

    def _release(self, items):
        pipe = self._client.pipeline(transaction=False)
        self._drop(pipe, items)
        pipe.execute()

    async def _release_async(self, items):
        if self._url is None:
            return await super()._release_async(items)
        client, _ = self._on_loop()
        pipe = client.pipeline(transaction=False)
        self._drop(pipe, items)
        await pipe.execute()

    def _drop(self, pipe, items) -> None:
        # One ZREM per cap key with all its holders: a burst's calls end by the
        # hundred on a few keys, and each command costs the client more than a member.
        holders: dict[str, list[str]] = {}
        for key, holder in items:
            holders.setdefault(key, []).append(holder)
        for key, members in holders.items():
            pipe.zrem(self.slots_key(key), *members)

    def _renew(self, items, now, lease_s):
        holders: dict[str, dict[str, float]] = {}
        for key, holder in items:
            holders.setdefault(key, {})[holder] = now + lease_s
        pipe = self._client.pipeline(transaction=False)
        for key, leases in holders.items():  # one ZADD per cap key, as for releases
            # XX: a slot that already expired is not taken back behind others' backs.
            # GT: never shorten a lease.
            pipe.zadd(self.slots_key(key), leases, xx=True, gt=True)
            pipe.expire(self.slots_key(key), int(lease_s + _KEY_GRACE_S) + 1, gt=True)
        pipe.execute()


def _answers(text: bytes, count: int) -> list[tuple[str, float] | None]:
    """The admission script's answer: None for each run admitted, else (reason, retry time)."""
    answers = text.split(b" ")
    if len(answers) != count:
        raise RuntimeError(f"the admission script answered {len(answers)} of {count} runs")
    return [None if answer == b"ok" else _held(answer) for answer in answers]


def _held(answer: bytes) -> tuple[str, float]:
    return _REASONS[answer[:1].decode()], float(answer[1:])
