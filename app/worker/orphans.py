"""A worker process's roll in Redis: the runs it started and has not called yet, so
that a live process makes them due again within seconds of this one's death, instead
of after their leases (docs/design.md, "Decisions": a dead worker's uncalled runs).

- `name(runs, caps, started_at)`: right before a start, one transaction: each run in
  the process's hash (with the start's instant), the caps it may take slots of, its
  beat; the runs the start did not start (another process's, same tokens) go out;
- `claim(run_id)` (on the calls' loop; a webhook's at its request's last look, once
  connected: app.worker.webhook): the run's name moves to the roll's names out, the
  claims made meanwhile in one script call, one out at a time; a call goes out only
  if its name was there (else a taker had it), written next with nothing awaited,
  and its name leaves the names out with the next claims (within CALLED_WITHIN_S).
  `claim_ahead(run_ids)`: the same a little before held calls' instants; one that
  waits in a full cap's line has its name put back (`back_in`) until its call claims
  it again. `forget(run_ids)`: runs that leave uncalled;
- the watcher (a thread, every BEAT_S, IDLE_LOOK_S when idle): beats while the
  process holds names or calls, and looks for a process whose beat is older than
  DEAD_AFTER_S. One script takes its roll (one taker; sent again, answered alike) and
  gives back its slots (holder names carry the process's word); its names are held
  back, fenced by token and start instant, due at their instants, no attempt spent
  (lease.hold); its names out, calls maybe made (most not), have their leases taken
  back at once, fenced, an attempt spent (app.pollers.janitor.expire_now).

An idle process sends one command every IDLE_LOOK_S. A taker dying mid-take, or Redis
or the registry away, leaves the runs to their leases; clocks agree within a second.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
import redis.asyncio

from app.core.timefmt import from_micros, to_micros, utcnow
from app.lifecycle import lease
from app.lifecycle.message import DispatchRun
from app.limits.redis_limiter import slots_key
from app.pollers import janitor

log = logging.getLogger("punctual.orphans")

# How often a process with names (or calls) beats, and looks for dead processes.
BEAT_S = 1.0
# How often a process with neither looks for dead processes: one command.
IDLE_LOOK_S = 2.0
# A process whose beat is older than this is dead: its named runs are taken.
DEAD_AFTER_S = 3.0
# How many dead processes one tick takes at most.
TAKEN_PER_TICK = 8
# A claim is not called once the process's last beat Redis took (the watcher's, a
# start's or a claim's) is this old, nor if a beat found the process's beat gone since
# it was answered: a taker may have thought the process dead (stopped, say) and taken
# back the run's lease.
CLAIM_FRESH_S = DEAD_AFTER_S - BEAT_S
# The names of runs called leave the names out with the next claims, or after this.
CALLED_WITHIN_S = 0.05

# How long a taken roll is kept for its taker to read again (below).
TAKEN_KEPT_S = 60

# KEYS: the beats; ARGV: the word, the beat instant below which it is dead, the
# prefix of rolls, the prefix of cap slot keys, the taker's word, TAKEN_KEPT_S. Answers
# nil (alive, or another taker's) or {slots given back, {field, value, ...} of names,
# the same of names out}. The roll taken is kept aside that long under the taker's
# word, and the same taker's script sent again answers it alike: the client sends a
# script call again when a connection dropped its answer, and the roll would be gone
# (the runs left to their leases). (An answer read again holds nothing twice: the holds
# and expiries are fenced by token.)
TAKE_SCRIPT = r"""
local roll = ARGV[3] .. ARGV[1]
local taken = roll .. ':taken'
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  local by = redis.call('HMGET', taken, 'by', 'freed')
  if by[1] ~= ARGV[5] then return false end
  return {tonumber(by[2]), redis.call('HGETALL', taken .. ':names'), redis.call('HGETALL', taken .. ':out')}
end
if tonumber(score) >= tonumber(ARGV[2]) then return false end
redis.call('ZREM', KEYS[1], ARGV[1])
local names = redis.call('HGETALL', roll)
local out = redis.call('HGETALL', roll .. ':out')
local caps = redis.call('SMEMBERS', roll .. ':caps')
local mark = '.' .. ARGV[1] .. '-'
local freed = 0
for _, cap in ipairs(caps) do
  local key = ARGV[4] .. cap
  for _, holder in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if string.find(holder, mark, 1, true) then
      redis.call('ZREM', key, holder)
      freed = freed + 1
    end
  end
end
redis.call('DEL', roll .. ':caps', taken .. ':names', taken .. ':out')
redis.call('HSET', taken, 'by', ARGV[5], 'freed', freed)
redis.call('EXPIRE', taken, ARGV[6])
for _, pair in ipairs({{roll, ':names'}, {roll .. ':out', ':out'}}) do
  if redis.call('EXISTS', pair[1]) == 1 then
    redis.call('RENAME', pair[1], taken .. pair[2])
    redis.call('EXPIRE', taken .. pair[2], ARGV[6])
  end
end
return {freed, names, out}
"""

# KEYS: the roll, its names out, the beats; ARGV: the word, the beat, how many claims,
# the run ids claimed, then those called. Moves each name claimed into the names out
# (1 for each, 0 for one gone), takes out the names of runs called, and beats. A name
# found out already answers 1: only this process's claims put names there, and a
# taker removes them all, so it is this call's own try, sent again by the client
# after a connection lost its answer (else the run would wait for its lease).
CLAIM_SCRIPT = r"""
local answers = {}
local claims = tonumber(ARGV[3])
for i = 4, claims + 3 do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HSET', KEYS[2], ARGV[i], value)
    answers[i - 3] = 1
  elseif redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    answers[i - 3] = 1
  else
    answers[i - 3] = 0
  end
end
for i = claims + 4, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return answers
"""

# KEYS: the roll, its names out, the beats; ARGV: the word, then a run id and its
# entry for each name put back. Puts the names back (1), unless a taker had the roll
# since (0): its beat is gone, and the roll must not be made anew.
PUT_BACK_SCRIPT = r"""
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return 1
"""

# What a name put back (Roll.back_in) answers the call waiting on it: claim it anew.
_BACK_IN = object()

_word_pid = 0
_word = ""


def process_word() -> str:
    """A random word of this process (drawn anew in a forked child): its roll's name,
    and part of every slot holder name it makes."""
    global _word_pid, _word
    if _word_pid != os.getpid():
        _word_pid, _word = os.getpid(), secrets.token_hex(4)
    return _word


def entry(run: DispatchRun, started_at: datetime) -> str:
    """What a roll keeps of a run: all a fenced hold needs, its instant, and the instant
    its start was given (`started_at`, in microseconds: the hold compares it exactly)."""
    _, job_id, token = run.texts
    at = _seconds(run.fire_at or run.scheduled_for)
    return f"{run.shard} {job_id} {token} {int(run.leased_on_run)} {at} {to_micros(started_at)}"


@functools.lru_cache(maxsize=4096)  # a burst's runs share a handful of instants
def _seconds(instant: datetime) -> str:
    """An instant as a roll keeps it: Unix seconds, printed exactly."""
    return repr(instant.timestamp())


def taken_runs(names: dict[str, str], now: datetime) -> list[tuple[DispatchRun, datetime, datetime | None]]:
    """A taken roll's runs, each with when it is due again (a schedule run at its own
    instant: the same occurrence, misfire-exempt; an off-schedule run at that instant
    or now) and the instant its start was given (None in an entry written by a
    version before it). Only what app.lifecycle.lease.hold reads is filled in."""
    held = []
    for run_id, value in names.items():
        shard, job_id, token, on_run, at_s, *started_us = value.split(" ")
        at = datetime.fromtimestamp(float(at_s), UTC)
        run = DispatchRun(
            run_id=uuid.UUID(run_id),
            job_id=uuid.UUID(job_id),
            shard=int(shard),
            owner="",
            origin="schedule",
            lease_token=uuid.UUID(token),
            scheduled_for=at,
            attempt=0,
            target={},
            retry={},
            payload=None,
            own_lease=on_run == "1",
        )
        started_at = from_micros(int(started_us[0])) if started_us else None
        held.append((run, max(at, now) if run.leased_on_run else at, started_at))
    return held


class Roll:
    """One process's roll (make it with `roll_for`; `start` runs the watcher)."""

    def __init__(self, url: str, prefix: str, registry_of=None, word: str | None = None):
        """`registry_of()`: the registry takeovers write to (made on first takeover)."""
        self.word = word or process_word()
        self._url = url
        self._client = redis.Redis.from_url(url)
        self._take = self._client.register_script(TAKE_SCRIPT)
        self._beats = f"{prefix}:orphans"
        self._rolls = f"{prefix}:orphans:"
        self._slots = slots_key(prefix, "")
        self._key = self._rolls + self.word
        self._out = self._key + ":out"
        self._registry_of = registry_of
        self._lock = threading.Lock()
        self._named: set[uuid.UUID] = set()
        self._forgotten: list[str] = []
        self._claims: list[tuple[uuid.UUID, asyncio.Future]] = []
        self._ahead: dict[uuid.UUID, asyncio.Future] = {}  # claimed ahead, not yet called
        # Runs whose names are being put back (`back_in`): False once forgotten meanwhile.
        self._backing: dict[uuid.UUID, bool] = {}
        # Names to put back in the next command: (run, its start's instant, its claim
        # ahead, its call's answer).
        self._backs: list[tuple[DispatchRun, datetime, asyncio.Future, asyncio.Future]] = []
        self._putting_back: set[asyncio.Future] = set()
        self._called: list[str] = []  # runs whose names are to leave the names out
        self._claiming = False  # a script call of claims is out
        self._calls_timer: asyncio.TimerHandle | None = None
        self._sent: asyncio.Future | None = None  # (kept: the loop holds tasks weakly)
        self._beaten = 0.0  # when the last beat that Redis took was sent (time.monotonic)
        self._taken_before = 0.0  # a taker had the process's roll before this (time.monotonic)
        self._on_loop: redis.asyncio.Redis | None = None  # the calls' loop's own connection
        self._claim_async: Any = None
        self._put_back_async: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Whether the process's calls may hold concurrency slots: it beats meanwhile
        # too, or a taker would give back the slots of its calls in flight.
        self.holding: Callable[[], bool] = lambda: False

    # -- the process's own names ----------------------------------------------------------

    def name(self, runs: Sequence[DispatchRun], caps: Iterable[str], started_at: datetime) -> None:
        """Name runs about to start at `started_at` (the instant the start writes), with
        the cap keys their calls may hold slots of (one transaction: a taker sees all of
        it with a fresh beat, or none of it). Should it fail, the runs are not named:
        their leases cover them, as before."""
        fields: dict[Any, Any] = {run.texts[0]: entry(run, started_at) for run in runs}
        if not fields:
            return
        caps = set(caps)
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self._key, mapping=fields)
        if caps:
            pipe.sadd(self._key + ":caps", *caps)
        pipe.zadd(self._beats, {self.word: time.time()})
        sent = time.monotonic()
        try:
            pipe.execute()
            self._beaten = sent
        except redis.RedisError:  # (written perhaps, the answer lost: out at the next tick)
            log.warning("naming %d runs failed; their leases cover them", len(fields), exc_info=True)
            self.forget(run.run_id for run in runs)
            return
        with self._lock:
            self._named.update(run.run_id for run in runs)

    def unname(self, run_ids: Sequence[uuid.UUID]) -> None:
        """Take out now the names of runs this process did not start: they may be
        another process's, under the same tokens, which a taker must not hold back.
        (Should Redis not answer, they go at the watcher's next tick.)"""
        if not run_ids:
            return
        for run_id in run_ids:
            self._named.discard(run_id)
        try:
            self._client.hdel(self._key, *(str(run_id) for run_id in run_ids))
        except redis.RedisError:
            log.warning("taking out %d names of runs not started failed", len(run_ids), exc_info=True)
            self.forget(run_ids)

    async def claim(self, run_id: uuid.UUID) -> bool:
        """(On the calls' loop.) Take the run's name out before its call: whether it may
        be called (False: a taker had it, so another attempt may be under way; or the
        answer came too late to tell). The claims made while one script call is out go
        together in the next. A name taken out ahead (`claim_ahead`) gives that answer,
        mostly there already. True: the caller makes the call next, nothing awaited."""
        ahead = self._ahead.pop(run_id, None)
        sent: Any = None
        if ahead is not None:
            sent = await ahead
            # _BACK_IN: its name went back in while it waited for a slot: out again now.
        if ahead is None or sent is _BACK_IN:
            future = self._claim(run_id)
            if future is None:  # never named: nothing to take out
                return True
            sent = await future
        if not sent or sent < self._taken_before or time.monotonic() - self._beaten >= CLAIM_FRESH_S:
            return False
        self._called.append(str(run_id))
        if not self._claiming and self._calls_timer is None:
            self._calls_timer = asyncio.get_running_loop().call_later(CALLED_WITHIN_S, self._send_claims)
        return True

    def claim_ahead(self, run_ids: Iterable[uuid.UUID]) -> None:
        """(On the calls' loop.) Take out now, together, the names of runs about to be
        called; each call's `claim` then awaits its answer. From here a crash has a taker
        take back their leases, an attempt spent: only runs whose calls are imminent
        are given."""
        for run_id in run_ids:
            future = self._claim(run_id)
            if future is not None:
                self._ahead[run_id] = future

    def back_in(self, run: DispatchRun, started_at: datetime) -> None:
        """(On the calls' loop.) A run whose name went out ahead waits for a cap's slot
        after all: once that claim is answered, and only if the name was ours, it goes
        back into the roll, so that a crash while the run waits has a taker hold it back,
        no attempt spent. Its call's `claim` then takes it out again. (Nothing for a run
        whose name did not go out ahead.) The names put back in one turn of the loop go
        in one command."""
        ahead = self._ahead.get(run.run_id)
        if ahead is None or run.run_id in self._backing:
            return
        self._backing[run.run_id] = True
        answer = self._ahead[run.run_id] = asyncio.get_running_loop().create_future()
        self._backs.append((run, started_at, ahead, answer))
        if len(self._backs) == 1:
            asyncio.get_running_loop().call_soon(self._send_backs)

    def _send_backs(self) -> None:
        backs, self._backs = self._backs, []
        task = asyncio.ensure_future(self._put_back(backs))
        self._putting_back.add(task)  # (the loop holds tasks weakly)
        task.add_done_callback(self._putting_back.discard)

    async def _put_back(
        self, backs: list[tuple[DispatchRun, datetime, asyncio.Future, asyncio.Future]]
    ) -> None:
        """`back_in`'s work. Each call waiting on it is answered _BACK_IN once its name
        is back (it claims it anew); else with its claim ahead's answer (0: a taker
        had the name), or 0 if the run was forgotten meanwhile or a taker had the roll
        since (the name was out: the taker took back its lease)."""
        ours = []
        names: dict[Any, Any] = {}
        for run, started_at, ahead, answer in backs:
            sent = await ahead
            if sent:
                ours.append((run, answer, sent))
                names[str(run.run_id)] = entry(run, started_at)
            else:
                self._backing.pop(run.run_id, None)
                answer.set_result(0.0)
        if not ours:
            return
        sent = time.monotonic()
        try:
            self._loop_client()
            args = [self.word, *(part for pair in names.items() for part in pair)]
            back = await self._put_back_async(keys=[self._key, self._out, self._beats], args=args)
        except Exception:  # the names stay out: a crash leaves the runs to a taker's expiry
            log.warning("putting back the names of %d runs failed", len(ours), exc_info=True)
            for run, answer, claimed in ours:
                self._backing.pop(run.run_id, None)
                answer.set_result(claimed)
            return
        if not back:  # a taker had the roll: claims answered before are void too
            self._taken_before = max(self._taken_before, sent)
            for run, answer, _ in ours:
                self._backing.pop(run.run_id, None)
                answer.set_result(0.0)
            return
        with self._lock:
            for run, answer, _ in ours:
                if self._backing.pop(run.run_id, False):
                    self._named.add(run.run_id)
                    answer.set_result(_BACK_IN)
                else:  # forgotten meanwhile: out at the next tick
                    self._forgotten.append(str(run.run_id))
                    answer.set_result(0.0)

    def _loop_client(self) -> redis.asyncio.Redis:
        """The calls' loop's own connection (made on first use)."""
        if self._on_loop is None:
            client = redis.asyncio.Redis.from_url(self._url)
            self._on_loop, self._claim_async = client, client.register_script(CLAIM_SCRIPT)
            self._put_back_async = client.register_script(PUT_BACK_SCRIPT)
        return self._on_loop

    def _claim(self, run_id: uuid.UUID) -> asyncio.Future | None:
        try:  # (one operation on a set: atomic, no lock needed on the calls' path)
            self._named.remove(run_id)
        except KeyError:  # never named (the naming failed), or forgotten
            return None
        future = asyncio.get_running_loop().create_future()
        self._claims.append((run_id, future))
        if len(self._claims) == 1 and not self._claiming:
            asyncio.get_running_loop().call_soon(self._send_claims)
        return future

    def _send_claims(self) -> None:
        """One script call at a time: the claims made while one is out go together in
        the next, so that a busy loop sends few calls of many names, not one a turn;
        with them, the names of the runs called since the last."""
        if self._calls_timer is not None:
            self._calls_timer.cancel()
            self._calls_timer = None
        if self._claiming or not (self._claims or self._called):
            return
        claims, self._claims = self._claims, []
        called, self._called = self._called, []
        self._claiming = True
        self._sent = asyncio.ensure_future(self._claimed(claims, called))
        self._sent.add_done_callback(self._next_claims)

    def _next_claims(self, _task: asyncio.Future) -> None:
        self._claiming = False
        if self._claims:
            self._send_claims()
        elif self._called and self._calls_timer is None:
            self._calls_timer = asyncio.get_running_loop().call_later(CALLED_WITHIN_S, self._send_claims)

    async def _claimed(self, claims: list[tuple[uuid.UUID, asyncio.Future]], called: list[str]) -> None:
        """One script call: each claim's future answered the instant it was sent
        (time.monotonic, the script beats), or 0.0 if a taker had its name."""
        sent, now = time.monotonic(), time.time()
        args = [self.word, repr(now), len(claims), *(str(run_id) for run_id, _ in claims), *called]
        try:
            self._loop_client()
            answers = await self._claim_async(keys=[self._key, self._out, self._beats], args=args)
        except Exception:
            # Cannot tell. While the process's last beat is recent enough that no taker
            # can have thought it dead, the calls go ahead; past that they are not made
            # (their leases cover them). Their names go at the watcher's next tick.
            fresh = time.monotonic() - self._beaten < CLAIM_FRESH_S
            made = "calls made" if fresh else "not called"
            log.warning("taking %d names out failed; %s", len(claims), made, exc_info=True)
            with self._lock:  # (not `forget`: a claim made ahead is still to be answered)
                self._forgotten.extend(str(run_id) for run_id, _ in claims)
                self._forgotten.extend(called)
            sent, answers = self._beaten, [int(fresh)] * len(claims)
        else:
            self._beaten = max(self._beaten, sent)
        for (_, future), answer in zip(claims, answers, strict=True):
            if not future.done():
                future.set_result(sent if answer else 0.0)

    def forget(self, run_ids: Iterable[uuid.UUID]) -> None:
        """Runs that leave without a call: their names go at the watcher's next tick
        (a taker's hold of one is fenced by its token, which is no longer current)."""
        with self._lock:
            for run_id in run_ids:
                self._named.discard(run_id)
                self._ahead.pop(run_id, None)  # (its name out already: harmless again)
                if run_id in self._backing:  # its name is being put back: out again after
                    self._backing[run_id] = False
                self._forgotten.append(str(run_id))

    def named(self) -> int:
        with self._lock:
            return len(self._named)

    async def aclose(self) -> None:
        """(On the calls' loop.) Send the names of the runs called, then close its connection."""
        while self._claiming or self._called:
            if not self._claiming:
                self._send_claims()
            if self._sent is not None:
                await asyncio.wait([self._sent])
            await asyncio.sleep(0)  # (its done callback: the next claims)
        if self._on_loop is not None:
            client, self._on_loop = self._on_loop, None
            await client.aclose()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """The process stops: the watcher, then the roll (what is left in it was
        settled or is covered by its lease)."""
        self._stop.set()
        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self._key, self._key + ":caps", self._out)
            pipe.zrem(self._beats, self.word)
            pipe.execute()
        except redis.RedisError:
            log.warning("removing the roll of process %s failed", self.word, exc_info=True)

    # -- the watcher ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="orphans", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        failing = False
        while True:
            try:
                self.tick()
                failing = False
            except Exception:  # the next tick tries again (said once until one works)
                if not failing:
                    log.warning("the watch for dead workers' runs failed", exc_info=True)
                failing = True
            if self._stop.wait(BEAT_S if self._busy() else IDLE_LOOK_S):
                return

    def _busy(self) -> bool:
        return bool(self._named) or bool(self._forgotten) or self.holding()

    def tick(self) -> int:
        """Beat if the process holds names, take out forgotten ones, and take the roll
        of each dead process found; returns how many runs were taken."""
        with self._lock:
            beat = self._busy()
            forgotten, self._forgotten = self._forgotten, []
        now = time.time()
        older = f"({now - DEAD_AFTER_S!r}"
        found: Any
        if not beat:  # idle: the look alone
            found = self._client.zrangebyscore(self._beats, "-inf", older, start=0, num=TAKEN_PER_TICK + 1)
        else:
            pipe = self._client.pipeline(transaction=False)
            pipe.zscore(self._beats, self.word)
            pipe.zadd(self._beats, {self.word: now})
            if forgotten:
                pipe.hdel(self._key, *forgotten)
                pipe.hdel(self._out, *forgotten)
            pipe.zrangebyscore(self._beats, "-inf", older, start=0, num=TAKEN_PER_TICK + 1)
            sent = time.monotonic()
            answers = pipe.execute()
            if answers[0] is None:  # a taker had the roll: claims answered before are void
                self._taken_before = sent
            self._beaten = sent
            found = answers[-1]
        dead = [w.decode() for w in found]
        return sum(self.take(word, now - DEAD_AFTER_S) for word in dead if word != self.word)

    def take(self, word: str, dead_before: float) -> int:
        """Take a dead process's roll (nothing if another taker was first, or it beat
        again), give back its slots, hold its runs back due and take back the leases of
        its names out; how many runs were held or taken back."""
        args: list[str | int] = [word, repr(dead_before), self._rolls, self._slots, self.word, TAKEN_KEPT_S]
        answer = self._take(keys=[self._beats], args=args)
        if answer is None:
            return 0
        freed, flat, flat_out = answer
        names, out = _pairs(flat), _pairs(flat_out)
        if not names and not out:
            return 0
        now = utcnow()
        held = taken_runs(names, now)
        assert self._registry_of is not None
        registry = self._registry_of()
        count = expired = 0
        try:  # (each retries a transient failure in place)
            if held:
                started = {run.run_id: started_at for run, _, started_at in held}
                count = lease.hold(registry, [(run, at) for run, at, _ in held], now, started)
            maybe_called = [run for run, _, _ in taken_runs(out, now)]
            expired = janitor.expire_now(registry, maybe_called, now) if out else 0
        except Exception:
            log.exception("taking the runs of dead process %s failed; leases cover them", word)
        log.warning(
            "process %s stopped beating: %d of its %d runs never called are due again, "
            "%d of its %d runs maybe called are taken back, %d slots back",
            word,
            count,
            len(held),
            expired,
            len(out),
            int(freed),
        )
        return count + expired


def _pairs(flat: list[bytes]) -> dict[str, str]:
    """A hash as HGETALL answers it, decoded."""
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}


_rolls: dict[tuple[str, str], Roll] = {}
_rolls_lock = threading.Lock()


def roll_for(settings, registry_of) -> Roll | None:
    """This process's roll (None without Redis: `punctual dev` has one worker), its
    watcher started."""
    if not settings.redis_url:
        return None
    identity = (settings.redis_url, settings.redis_prefix)
    with _rolls_lock:
        roll = _rolls.get(identity)
        if roll is None or roll.word != process_word() or roll.closed:
            roll = _rolls[identity] = Roll(settings.redis_url, settings.redis_prefix, registry_of)
            roll.start()
        return roll
