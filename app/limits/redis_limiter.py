"""The limiter on Redis: shared by every worker, one round trip per batch.

All of admission is the one Lua script below (contract: app.limits.limiter); a
line's look is another (app.limits.line: the turns of a full cap). Per spec key K
there are five Redis keys:

- `<prefix>:bucket:K`, a hash: `tat`, the rate's theoretical arrival time;
- `<prefix>:resv:K`, a sorted set: reserver -> the start reserved for it;
- `<prefix>:slots:K`, a sorted set: holder -> lease expiry (unix seconds);
- `<prefix>:tags:K`, a hash: `~r` and `~o`, the lanes' clocks; flow -> finish tag;
- `<prefix>:line:K`, a hash: line -> "<until> <flow> <weight> <runs> ...", the runs
  waiting for the cap in each line.

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

from app.limits.limiter import (
    AHEAD_SHOWN,
    CAP,
    DEFAULT_HOLD_S,
    EARLY_S,
    LINE_KEEP_S,
    RATE,
    RESERVATION_KEEP_S,
    TAGS_KEEP_S,
    TAGS_PRUNED_PAST,
    Limiter,
    Look,
    by_flow,
)
from app.limits.line import Ahead, Tags

__all__ = ["RedisLimiter", "ADMIT_SCRIPT", "LOOK_SCRIPT"]

# Seconds a key outlives the last thing it has to remember.
_KEY_GRACE_S = 60

# A full cap's turns, shared by both scripts: app.limits.line in Lua, the same
# arithmetic in the same order (floats are IEEE doubles on both sides, written with 17
# digits), so that the in-memory limiter and this one answer alike.
_LINE_LUA = r"""
local function fmt(x)
  return string.format('%.17g', x)
end

local function keep_for(key, seconds)
  redis.call('PEXPIRE', key, math.ceil((math.max(seconds, 0) + __GRACE__) * 1000))
end

local function rank(flow)
  if string.sub(flow, 1, 1) == 'r' then return 0 end
  return 1
end

-- The flows waiting for a cap in lines other than `line` (its line hash `key`): flow ->
-- {weight, runs}, and the flows in the order found. Records out of date are dropped.
local function elsewhere(key, line, now)
  local found, order = {}, {}
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local words = {}
    for word in string.gmatch(all[i + 1], '%S+') do words[#words + 1] = word end
    if tonumber(words[1]) <= now then
      redis.call('HDEL', key, all[i])
    elseif all[i] ~= line then
      for w = 2, #words - 2, 3 do
        local flow, weight, runs = words[w], tonumber(words[w + 1]), tonumber(words[w + 2])
        local f = found[flow]
        if f then
          f[1] = math.max(f[1], weight)
          f[2] = f[2] + runs
        else
          found[flow] = {weight, runs}
          order[#order + 1] = flow
        end
      end
    end
  end
  return found, order
end

-- The lanes' clocks and the finish tags of `flows` (a list of names).
local function read_tags(key, flows)
  local fields = {'~r', '~o'}
  for i = 1, #flows do fields[#fields + 1] = flows[i] end
  local values = redis.call('HMGET', key, unpack(fields))
  local T = {clock = {r = tonumber(values[1]) or 0, o = tonumber(values[2]) or 0}, finish = {}}
  for i = 1, #flows do
    if values[i + 2] then T.finish[flows[i]] = tonumber(values[i + 2]) end
  end
  return T
end

local function start(T, flow)
  return math.max(T.finish[flow] or 0, T.clock[string.sub(flow, 1, 1)] or 0)
end

-- Slots went to flows (`served`: flow -> {weight, slots}; `flows`: their names), each
-- flow's one after the other; every start read before any moves on. Written back.
local function charge(key, T, served, flows)
  local begins = {}
  for _, flow in ipairs(flows) do begins[flow] = start(T, flow) end
  local fields = {}
  for _, flow in ipairs(flows) do
    local weight, slots = served[flow][1], served[flow][2]
    if slots > 0 then
      local begin = begins[flow]
      T.finish[flow] = begin + slots / weight
      local lane = string.sub(flow, 1, 1)
      T.clock[lane] = math.max(T.clock[lane], begin + (slots - 1) / weight)
      fields[#fields + 1] = flow
      fields[#fields + 1] = fmt(T.finish[flow])
    end
  end
  if #fields == 0 then return end
  redis.call('HSET', key, '~r', fmt(T.clock.r), '~o', fmt(T.clock.o), unpack(fields))
  keep_for(key, __TAGS_KEEP__)
  if redis.call('HLEN', key) > __PRUNED_PAST__ then
    -- Flows level with their lane's clock start there anyway: forget them.
    local all = redis.call('HGETALL', key)
    local level = {}
    for i = 1, #all, 2 do
      local flow = all[i]
      if string.sub(flow, 1, 1) ~= '~' and tonumber(all[i + 1]) <= (T.clock[string.sub(flow, 1, 1)] or 0) then
        level[#level + 1] = flow
      end
    end
    if #level > 0 then redis.call('HDEL', key, unpack(level)) end
  end
end

-- How many of `free` slots each flow of `here` ({name, weight, runs}) takes when the
-- flows waiting elsewhere (`others`: {name, start, weight, runs}, none of them here)
-- take their turns too: by lane, start, then name.
local function allot(free, here, others, T)
  local grants, total = {}, 0
  for _, h in ipairs(here) do
    grants[h[1]] = 0
    total = total + h[3]
  end
  if free <= 0 or #here == 0 then return grants end
  if #others == 0 and total <= free then
    for _, h in ipairs(here) do grants[h[1]] = h[3] end
    return grants
  end
  -- A binary heap of {rank, start, name, mine, weight, runs}.
  local heap = {}
  local function less(x, y)
    if x[1] ~= y[1] then return x[1] < y[1] end
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[3] < y[3]
  end
  local function push(e)
    heap[#heap + 1] = e
    local i = #heap
    while i > 1 do
      local up = math.floor(i / 2)
      if not less(heap[i], heap[up]) then break end
      heap[i], heap[up] = heap[up], heap[i]
      i = up
    end
  end
  local function pop()
    local top = heap[1]
    heap[1] = heap[#heap]
    heap[#heap] = nil
    local i, n = 1, #heap
    while true do
      local low, l, r = i, 2 * i, 2 * i + 1
      if l <= n and less(heap[l], heap[low]) then low = l end
      if r <= n and less(heap[r], heap[low]) then low = r end
      if low == i then break end
      heap[i], heap[low] = heap[low], heap[i]
      i = low
    end
    return top
  end
  for _, h in ipairs(here) do
    if h[3] > 0 then push({rank(h[1]), start(T, h[1]), h[1], true, h[2], h[3]}) end
  end
  for _, o in ipairs(others) do
    push({rank(o[1]), o[2], o[1], false, o[3], o[4]})
  end
  while free > 0 and #heap > 0 do
    local e = pop()
    if e[4] then grants[e[3]] = grants[e[3]] + 1 end
    free = free - 1
    if e[6] > 1 then push({e[1], e[2] + 1 / e[5], e[3], e[4], e[5], e[6] - 1}) end
  end
  return grants
end
"""

ADMIT_SCRIPT = (
    r"""
-- Admit a batch of runs, each all-or-nothing across its limit specs.
--
-- KEYS: per spec key of the batch, once: bucket hash, slots sorted set, reservations
--       sorted set, tags hash, line hash
-- ARGV: now, lease_s, hold_s, the asker's line; n_keys, then per key: rate_per_s (0 =
--       no rate), max_concurrency (0 = no cap); n_groups, then per group (the specs
--       some runs share): n_specs, then the number of each of its keys; n_flows, then
--       per flow: its name and weight; last, the runs as one text, a line
--       "<group> <holder> <reserver> <flow>" per run, in order
-- Returns one text, a word per run in order: "ok" (admitted: its rate start taken or
-- its reservation used, a slot held until now + lease_s in every cap), "r<t>" (held
-- by a rate: a start is reserved for it at t, nothing else taken) or "c<t>" (every
-- slot of a cap taken, or the free ones due to flows waiting in other lines: nothing
-- taken; t is a hint).
--
-- A batch's runs mostly share their specs, so keys and limits travel once and a run
-- costs one line: the client's encoding of eight arguments a run, and of an answer
-- each, was most of what an admission cost the worker.
--
-- Rate: a GCRA. A start conforms when tat - tolerance <= now (tolerance: one second
-- of burst) and moves tat on by 1/rate; a run that does not conform reserves the next
-- conforming instant, which moves tat on as a start would, so a held run is held once.
-- Cap: holders whose lease expired are dropped first (a dead worker's slots come back).
-- When more of the batch's runs ask for a cap than it has free slots, or flows of other
-- lines wait for it, its free slots go by turns (allot); each slot taken is charged
-- to its flow. Each key is read once per call and written once at its end. Times are
-- the caller's (workers share NTP time), written with 17 digits (Lua's own tostring
-- keeps 14).
"""
    + _LINE_LUA
    + r"""
local now = tonumber(ARGV[1])
local lease_s = tonumber(ARGV[2])
local hold_s = tonumber(ARGV[3])
local line = ARGV[4]
local n_keys = tonumber(ARGV[5])
local early = __EARLY__
local keep = __KEEP__
local answers = {}
local seen, order = {}, {}
local a = 6
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
a = a + 1
local flows = {}
for f = 1, tonumber(ARGV[a]) do
  flows[f] = {ARGV[a + 2 * f - 1], tonumber(ARGV[a + 2 * f])}
end
a = a + 2 * #flows
local R = {}
for group, holder, reserver, flow in string.gmatch(ARGV[a + 1], '(%d+) ([^ \n]+) ([^ \n]+) (%d+)') do
  R[#R + 1] = {groups[tonumber(group)], holder, reserver, flows[tonumber(flow)]}
end

local function load(j)
  local S = seen[j]
  if S then return S end
  local rate, cap = limits[j][1], limits[j][2]
  S = {bucket = KEYS[5 * j - 4], slots = KEYS[5 * j - 3], resv = KEYS[5 * j - 2], tags = KEYS[5 * j - 1],
       line = KEYS[5 * j], rate = rate, cap = cap}
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

-- The turns: which caps' free slots are shared out, and how many go to each flow.
local asking = {}
for _, run in ipairs(R) do
  for _, j in ipairs(run[1]) do
    if limits[j][2] > 0 then
      local A = asking[j]
      if not A then
        A = {names = {}, here = {}}
        asking[j] = A
      end
      local flow = run[4]
      local h = A.here[flow[1]]
      if not h then
        h = {flow[1], flow[2], 0}
        A.here[flow[1]] = h
        A.names[#A.names + 1] = h
      end
      h[3] = h[3] + 1
    end
  end
end
for j, A in pairs(asking) do
  local S = load(j)
  local free = S.cap - S.count
  if free > 0 then
    local found, found_order = elsewhere(S.line, line, now)
    local total, names = 0, {}
    for _, h in ipairs(A.names) do
      total = total + h[3]
      names[#names + 1] = h[1]
    end
    local others = {}
    for _, name in ipairs(found_order) do
      if not A.here[name] and found[name][2] > 0 then
        others[#others + 1] = name
        names[#names + 1] = name
      end
    end
    if #others > 0 or total > free then
      S.T = read_tags(S.tags, names)
      local ahead = {}
      for _, name in ipairs(others) do
        ahead[#ahead + 1] = {name, start(S.T, name), found[name][1], found[name][2]}
      end
      S.grants = allot(free, A.names, ahead, S.T)
    end
  end
end

for r, run in ipairs(R) do
  local members, holder, reserver, flow = run[1], run[2], run[3], run[4]
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
    if S.cap > 0 and (S.count >= S.cap or (S.grants and S.grants[flow[1]] <= 0))
        and not redis.call('ZSCORE', S.slots, holder) then
      if not S.first then
        S.first = tonumber(redis.call('ZRANGE', S.slots, 0, 0, 'WITHSCORES')[2]) or now + hold_s
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
        if S.grants then S.grants[flow[1]] = S.grants[flow[1]] - 1 end
        if not S.served then S.served = {n = {}, names = {}} end
        local served = S.served.n[flow[1]]
        if not served then
          served = {flow[2], 0}
          S.served.n[flow[1]] = served
          S.served.names[#S.served.names + 1] = flow[1]
        end
        served[2] = served[2] + 1
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
  if S.added and redis.call('PTTL', S.slots) < (lease_s + __GRACE__) * 1000 then
    keep_for(S.slots, lease_s)
  end
  if S.served then
    charge(S.tags, S.T or read_tags(S.tags, S.served.names), S.served.n, S.served.names)
  end
end
return table.concat(answers, ' ')
"""
)

LOOK_SCRIPT = (
    r"""
-- A line's look at the caps its runs wait for.
--
-- KEYS: per cap: slots sorted set, tags hash, line hash
-- ARGV: now, the line, how long its record lasts, how many flows ahead to show; n_caps,
--       then per cap: max_concurrency, n_flows, then per flow of the line: its name,
--       weight, runs waiting, slots handed on since the last look
-- Returns per cap a list: free slots, the clocks of lanes r and o, then per flow of
-- the line with runs waiting: name, grant (how many may take a slot now), finish tag
-- ('' when level); then '|', then per flow waiting in another line, first in turn
-- first: name, start, weight, runs.
--
-- The slots handed on are charged first, the line's record replaced (a cap without
-- runs waiting is no longer waited for here), and the free slots shared out by turns.
"""
    + _LINE_LUA
    + r"""
local now, line = tonumber(ARGV[1]), ARGV[2]
local keep_s, shown = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local a = 6
for c = 1, tonumber(ARGV[5]) do
  local slots, tags, lines = KEYS[3 * c - 2], KEYS[3 * c - 1], KEYS[3 * c]
  local cap, n_flows = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  local here, in_here, record, names = {}, {}, {}, {}
  local served, served_names = {}, {}
  for _ = 1, n_flows do
    local flow, weight = ARGV[a], tonumber(ARGV[a + 1])
    local runs, handed = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    a = a + 4
    if runs > 0 then
      here[#here + 1] = {flow, weight, runs}
      in_here[flow] = true
      record[#record + 1] = flow .. ' ' .. weight .. ' ' .. runs
    end
    if handed > 0 then
      served[flow] = {weight, handed}
      served_names[#served_names + 1] = flow
    end
    names[#names + 1] = flow
  end
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', fmt(now))
  local free = math.max(0, cap - redis.call('ZCARD', slots))
  if #record > 0 then
    redis.call('HSET', lines, line, fmt(now + keep_s) .. ' ' .. table.concat(record, ' '))
    keep_for(lines, keep_s)
  else
    redis.call('HDEL', lines, line)
  end
  local found, found_order = elsewhere(lines, line, now)
  local others = {}
  for _, name in ipairs(found_order) do
    if not in_here[name] then
      others[#others + 1] = name
      names[#names + 1] = name
    end
  end
  local T = read_tags(tags, names)
  if #served_names > 0 then charge(tags, T, served, served_names) end
  local ahead = {}
  for _, name in ipairs(others) do
    ahead[#ahead + 1] = {name, start(T, name), found[name][1], found[name][2]}
  end
  local grants = allot(free, here, ahead, T)
  table.sort(ahead, function(x, y)
    if rank(x[1]) ~= rank(y[1]) then return rank(x[1]) < rank(y[1]) end
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[1] < y[1]
  end)
  local answer = {tostring(free), fmt(T.clock.r), fmt(T.clock.o)}
  for _, h in ipairs(here) do
    answer[#answer + 1] = h[1]
    answer[#answer + 1] = tostring(grants[h[1]])
    answer[#answer + 1] = T.finish[h[1]] and fmt(T.finish[h[1]]) or ''
  end
  answer[#answer + 1] = '|'
  for i = 1, math.min(shown, #ahead) do
    local e = ahead[i]
    answer[#answer + 1] = e[1]
    answer[#answer + 1] = fmt(e[2])
    answer[#answer + 1] = tostring(e[3])
    answer[#answer + 1] = tostring(e[4])
  end
  out[c] = answer
end
return out
"""
)


def _fill(script: str) -> str:
    return (
        script.replace("__GRACE__", str(_KEY_GRACE_S))
        .replace("__EARLY__", repr(EARLY_S))
        .replace("__KEEP__", repr(RESERVATION_KEEP_S))
        .replace("__TAGS_KEEP__", repr(TAGS_KEEP_S))
        .replace("__PRUNED_PAST__", str(TAGS_PRUNED_PAST))
    )


ADMIT_SCRIPT = _fill(ADMIT_SCRIPT)
LOOK_SCRIPT = _fill(LOOK_SCRIPT)

_REASONS = {"r": RATE, "c": CAP}


def slots_key(prefix: str, key: str) -> str:
    """The sorted set of a cap's slot leases (holder -> expiry); with key "", the
    prefix every cap's set shares (a dead process's slots are found by it)."""
    return f"{prefix}:slots:{key}"


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
        self._look_script = client.register_script(LOOK_SCRIPT)
        self._keys: dict[str, tuple[str, str, str, str, str]] = {}  # spec key -> its five Redis keys
        self._url = url
        # Per event loop: its client and the admission script on it (a connection
        # belongs to the loop that made it).
        self._on_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_url(cls, url: str, prefix: str, hold_s: float = DEFAULT_HOLD_S) -> RedisLimiter:
        return cls(redis.Redis.from_url(url), prefix, hold_s, url)

    def _on_loop(self) -> tuple[redis.asyncio.Redis, AsyncScript, AsyncScript]:
        """This event loop's client, admission script and look script."""
        loop = asyncio.get_running_loop()
        found = self._on_loops.get(loop)
        if found is None:
            assert self._url is not None
            client = redis.asyncio.Redis.from_url(self._url)
            found = self._on_loops[loop] = (
                client,
                client.register_script(ADMIT_SCRIPT),
                client.register_script(LOOK_SCRIPT),
            )
        return found

    async def aclose(self) -> None:
        found = self._on_loops.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[0].aclose()

    def bucket_key(self, key: str) -> str:
        return f"{self._prefix}:bucket:{key}"

    def slots_key(self, key: str) -> str:
        return slots_key(self._prefix, key)

    def reservations_key(self, key: str) -> str:
        return f"{self._prefix}:resv:{key}"

    def tags_key(self, key: str) -> str:
        return f"{self._prefix}:tags:{key}"

    def line_key(self, key: str) -> str:
        return f"{self._prefix}:line:{key}"

    def _redis_keys(self, key: str) -> tuple[str, str, str, str, str]:
        found = self._keys.get(key)
        if found is None:
            if len(self._keys) > 10_000:  # keys of targets long gone
                self._keys.clear()
            found = self._keys[key] = (
                self.bucket_key(key),
                self.slots_key(key),
                self.reservations_key(key),
                self.tags_key(key),
                self.line_key(key),
            )
        return found

    def _acquire(self, requests, now, lease_s, line):
        keys, args = self._admission(requests, now, lease_s, line)
        return _answers(self._admit(keys=keys, args=args), len(requests))

    async def _acquire_async(self, requests, now, lease_s, line):
        if self._url is None:
            return await super()._acquire_async(requests, now, lease_s, line)
        keys, args = self._admission(requests, now, lease_s, line)
        _, script, _ = self._on_loop()
        return _answers(await script(keys=keys, args=args), len(requests))

    def _admission(self, requests, now, lease_s, line) -> tuple[list[str], list]:
        """The admission script's KEYS and ARGV for `requests`."""
        numbers: dict[str, int] = {}  # spec key -> its number in the script (from 1)
        keys: list[str] = []
        limits: list[float | int] = []
        groups: dict[tuple[int, ...], int] = {}  # the numbers of a run's keys -> its group
        flows: dict[str, tuple[int, int]] = {}  # flow -> (its number in the script, weight)
        lines = []
        for specs, holder, reserver, turn in requests:
            members = []
            for spec in specs:
                number = numbers.get(spec.key)
                if number is None:
                    number = numbers[spec.key] = len(numbers) + 1
                    keys += self._redis_keys(spec.key)
                    limits += [spec.rate_per_s or 0, spec.max_concurrency or 0]
                members.append(number)
            group = groups.setdefault(tuple(members), len(groups) + 1)
            flow = flows.get(turn.flow)
            if flow is None:
                flow = flows[turn.flow] = (len(flows) + 1, turn.weight)
            lines.append(f"{group} {holder} {reserver} {flow[0]}")
        runs = "\n".join(lines)
        # A line is four words: a holder or reserver id with a space or a line break
        # in it would be read as another run.
        if runs.count(" ") != 3 * len(lines) or runs.count("\n") != len(lines) - 1:
            raise ValueError("a holder or reserver id holds a space or a line break")
        args: list[str | int | float] = [now, lease_s, self.hold_s, line, len(numbers), *limits, len(groups)]
        for members_of_group in groups:
            args += [len(members_of_group), *members_of_group]
        args.append(len(flows))
        for name, (_, weight) in flows.items():
            args += [name, weight]
        args.append(runs)
        return keys, args

    def _look(self, line, waiting, now):
        keys, args = self._looking(line, waiting, now)
        return _looks(waiting, self._look_script(keys=keys, args=args))

    async def _look_async(self, line, waiting, now):
        if self._url is None:
            return await super()._look_async(line, waiting, now)
        keys, args = self._looking(line, waiting, now)
        _, _, script = self._on_loop()
        return _looks(waiting, await script(keys=keys, args=args))

    def _looking(self, line, waiting, now) -> tuple[list[str], list]:
        """The look script's KEYS and ARGV."""
        keys: list[str] = []
        args: list[str | int | float] = [now, line, LINE_KEEP_S, AHEAD_SHOWN, len(waiting)]
        for item in waiting:
            _, slots, _, tags, lines = self._redis_keys(item.key)
            keys += [slots, tags, lines]
            runs, served = by_flow(item.runs), by_flow(item.served)
            flows = {**runs, **served}
            args += [item.max_concurrency, len(flows)]
            for flow in flows:
                weight = (runs.get(flow) or served[flow])[0]
                args += [flow, weight, runs.get(flow, (0, 0))[1], served.get(flow, (0, 0))[1]]
        return keys, args

    def _held(self, keys, now):
        pipe = self._client.pipeline(transaction=False)
        self._count_held(pipe, keys, now)
        return [int(count) for count in pipe.execute()]

    async def _held_async(self, keys, now):
        if self._url is None:
            return await super()._held_async(keys, now)
        client = self._on_loop()[0]
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
        client = self._on_loop()[0]
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


def _looks(waiting, answer: list) -> dict[str, Look]:
    """The look script's answer, by cap key."""
    found = {}
    for item, words in zip(waiting, answer, strict=True):
        words = [w.decode() if isinstance(w, bytes) else str(w) for w in words]
        tags = Tags({"r": float(words[1]), "o": float(words[2])})
        grants = {}
        at = 3
        while words[at] != "|":
            flow, grant, finish = words[at : at + 3]
            grants[flow] = int(grant)
            if finish:
                tags.finish[flow] = float(finish)
            at += 3
        ahead = [
            Ahead(words[i], float(words[i + 1]), int(words[i + 2]), int(words[i + 3]))
            for i in range(at + 1, len(words), 4)
        ]
        found[item.key] = Look(int(words[0]), grants, tags, tuple(ahead))
    return found
