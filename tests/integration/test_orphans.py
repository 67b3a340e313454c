"""A worker's roll (app.worker.orphans) on real Redis and Postgres: started runs named,
a name taken out before a call, and a dead process's roll taken by one live one."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import pytest
import redis

from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.limits.redis_limiter import slots_key as redis_slots_key
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.worker import orphans
from app.worker.orphans import CALLED_WITHIN_S, CLAIM_FRESH_S, DEAD_AFTER_S, Roll, entry
from tests.conftest import REDIS_URL
from tests.rows import insert_jobs, job, job_row, runs_of, webhook_target

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def _roll(registry, prefix: str, word: str) -> Roll:
    return Roll(REDIS_URL, prefix, lambda: registry, word=word)


def _claimed(registry, count: int) -> list:
    """`count` one-off runs, due a second ago, claimed."""
    rows = [
        job_row(16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target(f"http://127.0.0.1:9/{i}"))
        for i in range(count)
    ]
    insert_jobs(registry, rows)
    runs = []
    for shard in sorted({r["shard"] for r in rows}):
        runs += claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    return runs


def _started(registry, count: int) -> tuple[list, datetime]:
    """`count` one-off runs, due a second ago, claimed and started: the runs, and the
    instant their start wrote (what a roll names them with)."""
    runs, at = _claimed(registry, count), utcnow()
    assert len(lease.start(registry, runs, at)) == count
    return runs, at


def _claim(roll: Roll, run_id) -> bool:
    """A claim on a loop of its own (the roll's connection closed with it)."""

    async def claim() -> bool:
        try:
            return await roll.claim(run_id)
        finally:
            await roll.aclose()

    return asyncio.run(claim())


def _dead(prefix: str, word: str) -> None:
    """Make `word`'s beat older than DEAD_AFTER_S, as if its process had died then."""
    redis.Redis.from_url(REDIS_URL).zadd(f"{prefix}:orphans", {word: time.time() - DEAD_AFTER_S - 1})


def test_a_live_process_does_not_take_a_roll_that_beats(registry, redis_prefix):
    runs, at = _started(registry, 3)
    mine, other = _roll(registry, redis_prefix, "aaaa0001"), _roll(registry, redis_prefix, "bbbb0002")
    mine.name(runs, [], at)
    assert other.tick() == 0
    assert all(runs_of(registry, run.job_id)[0]["state"] == "running" for run in runs)


def test_a_dead_process_s_uncalled_runs_are_due_again_at_once_without_an_attempt(registry, redis_prefix):
    runs, at = _started(registry, 4)
    dead, taker = _roll(registry, redis_prefix, "aaaa0003"), _roll(registry, redis_prefix, "bbbb0004")
    dead.name(runs, ["cap:host"], at)
    called = runs[0]
    assert _claim(dead, called.run_id)  # its call went out: not the taker's
    slots = redis.Redis.from_url(REDIS_URL)
    slots_key = redis_slots_key(redis_prefix, "cap:host")
    far = time.time() + 60
    slots.zadd(slots_key, {f"{called.run_id}.aaaa0003-1": far, f"{called.run_id}.cccc0005-1": far})
    _dead(redis_prefix, "aaaa0003")

    assert taker.tick() == 3
    # Only the dead process's slot went back.
    assert [m.decode() for m in slots.zrange(slots_key, 0, -1)] == [f"{called.run_id}.cccc0005-1"]
    for run in runs[1:]:
        row = job(registry, run.job_id)
        assert row["state"] == "scheduled" and row["lease_token"] is None
        assert row["next_run_at"] == run.scheduled_for  # the same occurrence
        assert runs_of(registry, run.job_id) == []  # no attempt spent
    assert runs_of(registry, called.job_id)[0]["state"] == "running"  # in flight: its lease
    # One taker: the roll is gone, and the dead process may call none of its runs.
    assert _roll(registry, redis_prefix, "dddd0006").tick() == 0
    assert not _claim(dead, runs[1].run_id)


def test_a_dead_process_s_runs_maybe_called_are_taken_back_at_once_an_attempt_spent(registry, redis_prefix):
    """A name claimed whose call is not known made (the process died between the claim's
    answer and the script call that says so): its lease is taken back at once."""
    runs, at = _started(registry, 2)
    dead, taker = _roll(registry, redis_prefix, "aaaa0021"), _roll(registry, redis_prefix, "bbbb0022")
    dead.name(runs, [], at)
    maybe = runs[0]
    client = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}:orphans:aaaa0021"
    client.hdel(key, str(maybe.run_id))  # what the claim's script does
    client.hset(key + ":out", str(maybe.run_id), entry(maybe, at))
    _dead(redis_prefix, "aaaa0021")

    before = utcnow()
    assert taker.tick() == 2
    held = runs[1]
    assert job(registry, held.job_id)["next_run_at"] == held.scheduled_for
    assert runs_of(registry, held.job_id) == []  # no attempt spent
    after = job(registry, maybe.job_id)
    assert after["state"] == "scheduled" and after["lease_token"] is None and after["attempt"] == 1
    assert before <= after["next_run_at"] <= utcnow()  # due again now, not after its lease
    [failed] = runs_of(registry, maybe.job_id)
    assert failed["state"] == "failed" and failed["error"].startswith("lease expired")
    assert client.exists(key, key + ":out") == 0


def test_a_name_claimed_leaves_the_names_out_once_its_call_is_made(registry, redis_prefix):
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0023")
    roll.name(runs, [], at)
    out = f"{redis_prefix}:orphans:aaaa0023:out"
    client = redis.Redis.from_url(REDIS_URL)
    beat = client.zscore(f"{redis_prefix}:orphans", "aaaa0023")

    async def claim_then_look():
        roll.claim_ahead([runs[1].run_id])  # out ahead: not called yet
        assert await roll.claim(runs[0].run_id)
        claimed = set(client.hkeys(out))  # (the call is written here, nothing awaited)
        await asyncio.sleep(CALLED_WITHIN_S + 0.1)
        called = set(client.hkeys(out))
        await roll.aclose()
        return claimed, called

    claimed, called = asyncio.run(claim_then_look())
    assert claimed == {str(run.run_id).encode() for run in runs}
    assert called == {str(runs[1].run_id).encode()}
    assert client.zscore(f"{redis_prefix}:orphans", "aaaa0023") > beat  # a claim beats


def test_a_claim_is_not_called_once_the_process_s_beat_is_too_old(registry, redis_prefix, monkeypatch):
    """Called after the process could have been thought dead (stopped, say), a claim
    says no: a taker may have taken back the run's lease meanwhile."""
    runs, at = _started(registry, 1)
    roll = _roll(registry, redis_prefix, "aaaa0024")
    roll.name(runs, [], at)

    async def claim():
        future = roll._claim(runs[0].run_id)
        assert future is not None
        sent = await future
        monkeypatch.setattr(orphans.time, "monotonic", lambda: sent + CLAIM_FRESH_S)  # a stop meanwhile
        roll._ahead[runs[0].run_id] = future  # (answered: the call's claim reads it)
        answer = await roll.claim(runs[0].run_id)
        await roll.aclose()
        return answer

    assert asyncio.run(claim()) is False


def test_names_of_runs_that_leave_without_a_call_go_at_the_next_tick(registry, redis_prefix):
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0007")
    roll.name(runs, [], at)
    roll.forget([runs[0].run_id])
    assert roll.named() == 1
    roll.tick()
    assert redis.Redis.from_url(REDIS_URL).hkeys(f"{redis_prefix}:orphans:aaaa0007") == [
        str(runs[1].run_id).encode()
    ]


def test_claims_of_one_turn_of_the_loop_go_together(registry, redis_prefix):
    runs, at = _started(registry, 5)
    roll = _roll(registry, redis_prefix, "aaaa0008")
    roll.name(runs, [], at)

    async def claim_all():
        answers = await asyncio.gather(*(roll.claim(run.run_id) for run in runs))
        await roll.aclose()
        return answers

    assert asyncio.run(claim_all()) == [True] * 5
    assert roll.named() == 0
    assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:aaaa0008") == 0


def test_a_start_of_many_runs_names_each_with_its_entry_its_caps_and_a_beat(registry, redis_prefix):
    runs, at = _started(registry, 150)
    roll = _roll(registry, redis_prefix, "aaaa0013")
    roll.name(runs, ["cap:a", "cap:b"], at)
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    key = f"{redis_prefix}:orphans:aaaa0013"
    assert client.hgetall(key) == {str(run.run_id): entry(run, at) for run in runs}
    assert client.smembers(key + ":caps") == {"cap:a", "cap:b"}
    assert time.time() - client.zscore(f"{redis_prefix}:orphans", "aaaa0013") < 5


def test_claims_that_go_together_are_answered_each_by_its_own_name(registry, redis_prefix):
    runs, at = _started(registry, 3)
    roll = _roll(registry, redis_prefix, "aaaa0014")
    roll.name(runs, [], at)
    redis.Redis.from_url(REDIS_URL).hdel(f"{redis_prefix}:orphans:aaaa0014", str(runs[1].run_id))  # a taker's

    async def claim_all():
        answers = await asyncio.gather(*(roll.claim(run.run_id) for run in runs))
        await roll.aclose()
        return answers

    assert asyncio.run(claim_all()) == [True, False, True]


def test_a_duplicated_message_leaves_no_name_a_taker_could_hold(pg_settings, registry, redis_prefix):
    """The runs a start does not start (another process's, under the same tokens) are
    taken out of the roll at once: a taker must never hold back a run called elsewhere."""
    from app.worker.context import WorkerContext

    runs, _ = _started(registry, 3)  # started already, as by the message's first delivery
    context = WorkerContext(pg_settings)
    try:
        assert context.dispatcher.dispatch(runs).stale == 3
        assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:{context.roll.word}") == 0
    finally:
        context.close(5)


def test_names_taken_out_ahead_go_together_and_answer_their_calls(registry, redis_prefix):
    runs, at = _started(registry, 4)
    roll = _roll(registry, redis_prefix, "aaaa0009")
    roll.name(runs, [], at)
    key = f"{redis_prefix}:orphans:aaaa0009"

    async def ahead_then_claim():
        roll.claim_ahead(run.run_id for run in runs[:3])
        await asyncio.sleep(0.2)  # answered before the calls ask
        left = redis.Redis.from_url(REDIS_URL).hkeys(key)
        roll.forget([runs[2].run_id])  # put off after its name went out: no call
        answers = [await roll.claim(run.run_id) for run in runs[:2]]
        await roll.aclose()
        return left, answers

    left, answers = asyncio.run(ahead_then_claim())
    assert left == [str(runs[3].run_id).encode()]  # a taker now holds back only that one
    assert answers == [True, True]
    assert roll.named() == 1 and not roll._ahead


def _taken_by_a_taker(registry, redis_prefix, count: int, dead_word: str, taker_word: str):
    """`count` runs named by a process found dead, whose roll a taker then took: the
    runs and the dead process's roll."""
    runs, at = _started(registry, count)
    dead, taker = _roll(registry, redis_prefix, dead_word), _roll(registry, redis_prefix, taker_word)
    dead.name(runs, [], at)
    _dead(redis_prefix, dead_word)
    assert taker.tick() == count
    return runs, dead


def test_a_name_taken_by_a_taker_before_it_went_out_ahead_is_not_called(registry, redis_prefix):
    runs, dead = _taken_by_a_taker(registry, redis_prefix, 2, "aaaa0010", "bbbb0011")

    async def ahead_then_claim():
        dead.claim_ahead(run.run_id for run in runs)
        answers = [await dead.claim(run.run_id) for run in runs]
        await dead.aclose()
        return answers

    assert asyncio.run(ahead_then_claim()) == [False, False]


def test_a_name_that_could_not_go_out_ahead_is_not_called_once_the_beat_is_old(registry, redis_prefix):
    runs, at = _started(registry, 1)
    roll = _roll(registry, redis_prefix, "aaaa0012")
    roll.name(runs, [], at)
    roll._url = "redis://127.0.0.1:1/0"  # Redis away for the calls' loop
    roll._beaten = time.monotonic() - DEAD_AFTER_S  # a taker may think the process dead

    async def ahead_then_claim():
        roll.claim_ahead([runs[0].run_id])
        await asyncio.sleep(0.2)  # its answer came before the call asks
        answer = await roll.claim(runs[0].run_id)
        await roll.aclose()
        return answer

    assert asyncio.run(ahead_then_claim()) is False
    roll.tick()  # its name goes at the watcher's next tick
    assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:aaaa0012") == 0


def test_a_name_put_back_while_its_run_waits_is_claimed_anew_by_its_call(registry, redis_prefix):
    """A run named out ahead that waits for a cap's slot after all has its name back in
    the roll meanwhile (a taker would hold it back), until its call takes it out."""
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0017")
    roll.name(runs, [], at)
    key = f"{redis_prefix}:orphans:aaaa0017"
    client = redis.Redis.from_url(REDIS_URL)

    async def ahead_back_then_claim():
        roll.claim_ahead(run.run_id for run in runs)
        roll.back_in(runs[0], at)  # it found its cap full at its instant
        await asyncio.sleep(0.2)
        waiting = client.hkeys(key)
        named = roll.named()
        answers = [await roll.claim(run.run_id) for run in runs]
        await roll.aclose()
        return waiting, named, answers

    waiting, named, answers = asyncio.run(ahead_back_then_claim())
    assert waiting == [str(runs[0].run_id).encode()] and named == 1
    assert answers == [True, True]
    assert client.hlen(key) == 0 and roll.named() == 0 and not roll._ahead


def test_a_name_a_taker_had_before_it_went_out_ahead_is_not_put_back(registry, redis_prefix):
    runs, dead = _taken_by_a_taker(registry, redis_prefix, 1, "aaaa0018", "bbbb0019")

    async def ahead_back_then_claim():
        dead.claim_ahead([runs[0].run_id])
        dead.back_in(runs[0], utcnow())
        answer = await dead.claim(runs[0].run_id)
        await dead.aclose()
        return answer

    assert asyncio.run(ahead_back_then_claim()) is False
    assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:aaaa0018") == 0
    assert dead.named() == 0


def test_a_name_out_ahead_whose_roll_a_taker_had_is_not_put_back_nor_called(registry, redis_prefix):
    """A process stopped past DEAD_AFTER_S with a name out ahead: the taker takes back
    that run's lease (an attempt spent). Resumed, the run finds its cap full: putting
    its name back must not make the taken roll anew, and its call is not made."""
    runs, at = _started(registry, 1)
    stopped, taker = _roll(registry, redis_prefix, "aaaa0035"), _roll(registry, redis_prefix, "bbbb0036")
    stopped.name(runs, [], at)
    key = f"{redis_prefix}:orphans:aaaa0035"

    async def ahead_taken_back_then_claim():
        stopped.claim_ahead([runs[0].run_id])
        await asyncio.sleep(0.2)  # its name is out
        _dead(redis_prefix, "aaaa0035")
        assert await asyncio.to_thread(taker.tick) == 1
        stopped.back_in(runs[0], at)
        answer = await stopped.claim(runs[0].run_id)
        await stopped.aclose()
        return answer

    assert asyncio.run(ahead_taken_back_then_claim()) is False
    assert redis.Redis.from_url(REDIS_URL).exists(key, key + ":out") == 0
    [expired] = runs_of(registry, runs[0].job_id)
    assert expired["error"].startswith("lease expired")


def test_a_run_put_off_while_its_name_is_put_back_leaves_no_name(registry, redis_prefix):
    runs, at = _started(registry, 1)
    roll = _roll(registry, redis_prefix, "aaaa0020")
    roll.name(runs, [], at)

    async def ahead_back_forget():
        roll.claim_ahead([runs[0].run_id])
        roll.back_in(runs[0], at)
        roll.forget([runs[0].run_id])  # put off to the registry before its name was back
        await asyncio.sleep(0.2)
        await roll.aclose()

    asyncio.run(ahead_back_forget())
    roll.tick()
    assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:aaaa0020") == 0
    assert roll.named() == 0


@pytest.fixture
def sink():
    from tests.sink import Sink

    server = Sink()
    yield server
    server.close()


def _calling(pg_settings, registry, roll: Roll, sink, monkeypatch, on_connect, due_in_s: float = -1.0):
    """A worker context whose dispatcher names runs in `roll` and calls the sink as
    host `roll.sink`: `on_connect()` runs as each connection to it is being made (the
    name's resolution, on a thread of the calls' loop), before a byte is written."""
    import socket

    from app.services.owners import create_key
    from app.worker.context import WorkerContext

    create_key(registry, "tests")
    real_getaddrinfo = socket.getaddrinfo

    def resolving(host, port, *args, **kwargs):
        if host == "roll.sink":
            on_connect()
            host = "127.0.0.1"
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolving)
    context = WorkerContext(pg_settings)
    context.roll = roll  # (not started: no beat but the naming's)
    port = int(sink.base_url.rsplit(":", 1)[1])
    target = webhook_target(f"http://roll.sink:{port}/r")
    rows = [job_row(16, run_at=utcnow() + timedelta(seconds=due_in_s), target=target)]
    insert_jobs(registry, rows)
    [shard] = {r["shard"] for r in rows}
    runs = claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    return context, runs


def _settled(context, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while context.dispatcher.in_flight() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert context.dispatcher.in_flight() == 0


def test_a_webhook_call_s_name_stays_in_the_roll_until_its_connection_is_made(
    pg_settings, registry, redis_prefix, sink, monkeypatch
):
    """A process killed while it connects leaves the run to a taker, not to its lease."""
    roll = _roll(registry, redis_prefix, "aaaa0013")
    client = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}:orphans:aaaa0013"
    seen: list[bool] = []
    context, [run] = _calling(
        pg_settings,
        registry,
        roll,
        sink,
        monkeypatch,
        lambda: seen.append(bool(client.hexists(key, str(run.run_id)))),
    )
    try:
        assert context.dispatcher.dispatch([run]).started == 1
        sink.wait_for(1)
        _settled(context)
    finally:
        context.close(5)
    assert seen == [True]  # named while the connection was being made
    assert client.hlen(key) == 0 and roll.named() == 0  # out before its request went


def test_a_held_run_under_a_cap_with_room_has_its_name_out_ahead_of_its_connection(
    pg_settings, registry, redis_prefix, sink, monkeypatch
):
    """Under a cap with room (the default per target) a held run's name goes out ahead,
    as under none: had it found the cap full, its name would have gone back in while it
    waited (test_a_name_put_back_while_its_run_waits_is_claimed_anew_by_its_call)."""
    assert pg_settings.target_max_concurrency  # the shipped per-target cap is on
    roll = _roll(registry, redis_prefix, "aaaa0016")
    client = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}:orphans:aaaa0016"
    seen: list[bool] = []
    context, [run] = _calling(
        pg_settings,
        registry,
        roll,
        sink,
        monkeypatch,
        lambda: seen.append(bool(client.hexists(key, str(run.run_id)))),
        due_in_s=0.5,
    )
    try:
        assert run.fire_at is not None  # held for its instant
        assert context.dispatcher.dispatch([run]).started == 1
        sink.wait_for(1)
        _settled(context)
    finally:
        context.close(5)
    assert seen == [False]  # taken out ahead of its instant
    assert client.hlen(key) == 0 and roll.named() == 0


def test_a_roll_taken_while_a_call_connects_sends_no_request(
    pg_settings, registry, redis_prefix, sink, monkeypatch
):
    """The name goes out right before the write: a taker that had it first made the run
    due again, so the target never gets the request, and nothing is recorded."""
    roll = _roll(registry, redis_prefix, "aaaa0014")
    taker = _roll(registry, redis_prefix, "bbbb0015")
    taken: list[int] = []

    def taken_meanwhile() -> None:  # the process seemed dead while it connected
        _dead(redis_prefix, "aaaa0014")
        taken.append(taker.tick())

    context, [run] = _calling(pg_settings, registry, roll, sink, monkeypatch, taken_meanwhile)
    try:
        assert context.dispatcher.dispatch([run]).started == 1
        _settled(context)
        time.sleep(0.2)  # (a request would have come by now)
    finally:
        context.close(5)
    assert taken == [1]
    assert sink.calls() == []
    row = job(registry, run.job_id)
    assert row["state"] == "scheduled" and row["lease_token"] is None
    assert runs_of(registry, run.job_id) == []  # no attempt spent, no outcome recorded


def test_a_webhook_call_whose_connection_failed_leaves_no_name(pg_settings, registry, redis_prefix):
    """Its request never got to the write, so its name was never asked for: it goes
    at the watcher's next tick, as the failed call is recorded."""
    from app.services.owners import create_key
    from app.worker.context import WorkerContext

    create_key(registry, "tests")
    roll = _roll(registry, redis_prefix, "aaaa0016")
    context = WorkerContext(pg_settings)
    context.roll = roll
    rows = [
        job_row(
            16, run_at=utcnow() - timedelta(seconds=1), target=webhook_target("http://127.0.0.1:9/refused")
        )
    ]
    insert_jobs(registry, rows)
    [shard] = {r["shard"] for r in rows}
    runs = claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings).runs
    try:
        assert context.dispatcher.dispatch(runs).started == 1
        _settled(context)
        assert roll.named() == 0
        roll.tick()
        assert redis.Redis.from_url(REDIS_URL).hlen(f"{redis_prefix}:orphans:aaaa0016") == 0
        assert runs_of(registry, runs[0].job_id)[0]["state"] == "failed"
    finally:
        context.close(5)


def _claimed_ahead(roll: Roll, run_id) -> None:
    """`run_id`'s name out ahead, answered, its call still to come (the loop closed)."""

    async def ahead():
        roll.claim_ahead([run_id])
        await asyncio.sleep(0.2)
        await roll.aclose()

    asyncio.run(ahead())


def _called(roll: Roll, run_id) -> bool:
    """The call's own claim (the one answered ahead), on a loop of its own."""

    async def call():
        future = asyncio.get_running_loop().create_future()
        future.set_result(sent)
        roll._ahead[run_id] = future
        answer = await roll.claim(run_id)
        await roll.aclose()
        return answer

    sent = roll._ahead.pop(run_id).result()
    return asyncio.run(call())


def test_a_claim_waits_for_its_call_as_long_as_the_process_beats(registry, redis_prefix, monkeypatch):
    """A run claimed ahead that then waits seconds for a call slot is still called:
    the process beat meanwhile, so no taker can have had its name."""
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0025")
    roll.name(runs, [], at)
    _claimed_ahead(roll, runs[0].run_id)
    later = time.monotonic() + CLAIM_FRESH_S + 1
    monkeypatch.setattr(orphans.time, "monotonic", lambda: later)
    roll.tick()  # the watcher's beat (a run named still: it beats)
    assert _called(roll, runs[0].run_id)


def test_a_claim_answered_before_a_taker_had_the_roll_is_not_called(registry, redis_prefix):
    """Stopped after a claim's answer, the process was taken for dead; resumed, its
    watcher's beat may land before the call: it finds the beat gone, and the call is not
    made (the taker took its lease back: another attempt is under way)."""
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0026")
    roll.name(runs, [], at)
    _claimed_ahead(roll, runs[0].run_id)
    _dead(redis_prefix, "aaaa0026")
    assert _roll(registry, redis_prefix, "bbbb0027").tick() == 2
    roll.tick()
    assert not _called(roll, runs[0].run_id)


def test_a_taker_leaves_runs_another_process_started_under_the_dead_process_s_tokens(registry, redis_prefix):
    """A process killed between naming a message's runs and its start's commit: the
    message goes back to the broker and another process starts them, under the same
    tokens, and calls them. The taker of the dead process's roll must leave them to
    that process (held back, they would be called twice at the same attempt)."""
    runs = _claimed(registry, 3)
    dead, taker = _roll(registry, redis_prefix, "aaaa0031"), _roll(registry, redis_prefix, "bbbb0032")
    dead.name(runs, [], utcnow())  # its start never committed
    assert len(lease.start(registry, runs[:2], utcnow())) == 2  # the redelivered message's
    _dead(redis_prefix, "aaaa0031")

    assert taker.tick() == 1
    for run in runs[:2]:
        [row] = runs_of(registry, run.job_id)
        assert row["state"] == "running" and row["lease_token"] == run.lease_token
        assert job(registry, run.job_id)["lease_token"] == run.lease_token
    never = job(registry, runs[2].job_id)  # started by nobody: due again, no attempt spent
    assert never["state"] == "scheduled" and never["lease_token"] is None
    assert never["next_run_at"] == runs[2].scheduled_for and runs_of(registry, runs[2].job_id) == []


def test_a_taker_leaves_an_off_schedule_run_another_process_started_under_its_token(registry, redis_prefix):
    """The same for runs leased on their own rows (a trigger, a retry, a replay)."""
    from app.lifecycle.message import DispatchRun
    from app.pollers import relay
    from app.services.jobs import trigger_job

    rows = [job_row(16, run_at=utcnow() + timedelta(hours=1), shard=10) for _ in range(2)]
    insert_jobs(registry, rows)
    for row in rows:
        trigger_job(registry, "tests", str(row["job_id"]), utcnow())
    sent: list = []
    relay.sweep(registry.engine_for_shard(10), 10, utcnow(), lambda shard, messages: sent.extend(messages))
    runs = [DispatchRun.from_message(entry) for _, entries in sent for entry in entries]
    assert len(runs) == 2 and all(run.leased_on_run for run in runs)
    dead, taker = _roll(registry, redis_prefix, "aaaa0033"), _roll(registry, redis_prefix, "bbbb0034")
    dead.name(runs, [], utcnow())  # its start never committed
    assert len(lease.start(registry, runs[:1], utcnow())) == 1  # another process's
    _dead(redis_prefix, "aaaa0033")

    assert taker.tick() == 1
    [started] = runs_of(registry, runs[0].job_id)
    assert started["state"] == "running" and started["lease_token"] == runs[0].lease_token
    [held] = runs_of(registry, runs[1].job_id)  # claimed again, under a new token, no attempt spent
    assert held["state"] == "claimed" and held["lease_token"] != runs[1].lease_token
    assert held["attempt"] == runs[1].attempt


def test_a_claim_sent_again_after_its_answer_was_lost_is_answered_alike(registry, redis_prefix):
    """The client sends a script call again when a connection dropped its answer: the
    names it moved out the first time are still this process's to call."""
    runs, at = _started(registry, 2)
    roll = _roll(registry, redis_prefix, "aaaa0037")
    roll.name(runs[:1], [], at)
    client = redis.Redis.from_url(REDIS_URL)
    claim = client.register_script(orphans.CLAIM_SCRIPT)
    key = f"{redis_prefix}:orphans:aaaa0037"
    args = ["aaaa0037", repr(time.time()), 2, str(runs[0].run_id), str(runs[1].run_id)]
    first = claim(keys=[key, key + ":out", f"{redis_prefix}:orphans"], args=args)
    again = claim(keys=[key, key + ":out", f"{redis_prefix}:orphans"], args=args)
    assert first == again == [1, 0]  # (the second run was never named here)
    _dead(redis_prefix, "aaaa0037")  # taken: its names out are the taker's
    assert _roll(registry, redis_prefix, "bbbb0038").tick() == 1
    assert claim(keys=[key, key + ":out", f"{redis_prefix}:orphans"], args=args) == [0, 0]


def test_a_take_sent_again_after_its_answer_was_lost_is_answered_alike(registry, redis_prefix):
    """The client sends a script call again when a connection dropped its answer: the
    roll the first run took is the same taker's to hold back, and no one else's."""
    runs, at = _started(registry, 2)
    _roll(registry, redis_prefix, "aaaa0039").name(runs, ["cap:host"], at)
    client = redis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}:orphans:aaaa0039"
    client.hdel(key, str(runs[0].run_id))  # what the claim's script does
    client.hset(key + ":out", str(runs[0].run_id), entry(runs[0], at))
    slots_key = redis_slots_key(redis_prefix, "cap:host")
    client.zadd(slots_key, {f"{runs[0].run_id}.aaaa0039-1": time.time() + 60})
    _dead(redis_prefix, "aaaa0039")
    take = client.register_script(orphans.TAKE_SCRIPT)

    def taken_by(word: str):
        args = [
            "aaaa0039",
            repr(time.time() - DEAD_AFTER_S),
            f"{redis_prefix}:orphans:",
            redis_slots_key(redis_prefix, ""),
            word,
            60,
        ]
        return take(keys=[f"{redis_prefix}:orphans"], args=args)

    first = taken_by("bbbb0040")
    assert first[0] == 1 and len(first[1]) == len(first[2]) == 2  # one name each, one slot
    assert taken_by("bbbb0040") == first
    assert taken_by("cccc0041") is None
    assert client.exists(key, key + ":out", key + ":caps") == 0
    assert 0 < client.ttl(key + ":taken:names") <= 60
