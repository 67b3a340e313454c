"""`punctual shards move`: every row arrives, nothing stays behind, writes during the
move are carried, the fence refuses stale writers, an interrupted move is re-run or
aborted to a consistent map."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, apply, complete
from app.lifecycle.message import DispatchRun
from app.pollers.claim import claim_batch
from app.registry import mover
from app.registry.engines import Registry, is_fence_error
from app.registry.migrate import migrate_all
from app.registry.records import run_row
from app.registry.schema import jobs, runs, shard_fences
from app.settings import Settings
from tests.conftest import _pg_url, create_database, drop_database
from tests.e2e.processes import REPO
from tests.rows import job_row

pytestmark = pytest.mark.integration

SHARDS = 8


@pytest.fixture(scope="module")
def dsns(pg_admin, pg_template):
    """A cluster of two databases, then a third added at the end (holding nothing)."""
    names = [create_database(pg_admin, pg_template) for _ in range(3)]
    found = tuple(_pg_url(n) for n in names)
    migrate_all(found[:2], shards=SHARDS)
    migrate_all(found, shards=SHARDS)
    yield found
    for name in names:
        drop_database(pg_admin, name)


@pytest.fixture
def registry(dsns):
    reg = Registry(
        Settings.from_env({"PUNCTUAL_DATABASE_URLS": ",".join(dsns), "PUNCTUAL_SHARDS": str(SHARDS)})
    )
    reg.map_refresh_s = 0.1
    yield reg
    reg.dispose()


def fill(registry: Registry, shard: int, count: int) -> set[uuid.UUID]:
    """`count` jobs on `shard`, each with a finished run and, every tenth, a dead letter."""
    now = utcnow()
    rows = [job_row(SHARDS, shard=shard, run_at=now + timedelta(days=1)) for _ in range(count)]
    history = []
    for i, row in enumerate(rows):
        for state in ("succeeded",) + (("dead",) if i % 10 == 0 else ()):
            history.append(
                run_row(
                    job_id=row["job_id"],
                    shard=shard,
                    owner=row["owner"],
                    origin="schedule",
                    scheduled_for=now,
                    attempt=1,
                    state=state,
                    target=row["target"],
                    retry={},
                    now=now,
                    finished_at=now,
                )
            )
    with registry.engine_for_shard(shard).begin() as conn:
        conn.execute(jobs.insert(), rows)
        conn.execute(runs.insert(), history)
    return {row["job_id"] for row in rows}


def rows_of(engine: sa.Engine, shard: int) -> tuple[set, int]:
    with engine.connect() as conn:
        ids = set(conn.execute(sa.select(jobs.c.job_id).where(jobs.c.shard == shard)).scalars())
        count = conn.execute(
            sa.select(sa.func.count()).select_from(runs).where(runs.c.shard == shard)
        ).scalar_one()
    return ids, count


def fence_of(engine: sa.Engine, shard: int) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(shard_fences.c.mode).where(shard_fences.c.shard == shard)).scalar()


def test_a_move_copies_jobs_history_and_dead_letters_then_deletes_the_source(registry):
    ids = fill(registry, 3, 250)
    source = registry.engine_for_shard(3)
    report = mover.move_shard(registry, 3, 2, batch=40)
    assert (report.jobs, report.runs) == (250, 275)
    routing = registry.reload_map()
    assert routing.shard_index[3] == 2 and routing.map.placements[3].move_step is None
    assert rows_of(registry.engines[2], 3) == (ids, 275)
    assert rows_of(source, 3) == (set(), 0)
    assert fence_of(source, 3) == "fenced" and fence_of(registry.engines[2], 3) is None
    # A process still holding the old map cannot write where nobody reads any more.
    with pytest.raises(sa.exc.DBAPIError) as refused, source.begin() as conn:
        conn.execute(jobs.insert(), [job_row(SHARDS, shard=3, run_at=utcnow())])
    assert is_fence_error(refused.value)
    # ... while the shards the source still serves take writes as before.
    with source.begin() as conn:
        conn.execute(
            jobs.insert(), [job_row(SHARDS, shard=registry.routing().shards_of(0)[0], run_at=utcnow())]
        )


def test_a_start_or_heartbeat_on_a_database_the_shard_left_is_refused_though_no_row_is_there(registry):
    # A worker whose map is a moment old starts (or renews) runs of a shard on the
    # database it left: the rows are gone, so the write would match nothing and look
    # stale. The fence's refusal comes with the one statement regardless.
    shard = 6
    fill(registry, shard, 5)
    source = registry.engine_for_shard(shard)
    here = registry.reload_map().shard_index[shard]
    mover.move_shard(registry, shard, next(i for i in range(len(registry.engines)) if i != here))
    now = utcnow()
    on_jobs = [
        {
            "run_id": uuid.uuid4(),
            "job_id": uuid.uuid4(),
            "lease_token": uuid.uuid4(),
            "shard": shard,
            "owner": "o",
            "scheduled_for": now,
            "attempt": 1,
            "target": {},
            "retry": {},
            "lateness_ms": 0,
        }
    ]
    rows = [{"run_id": uuid.uuid4(), "lease_token": uuid.uuid4(), "lateness_ms": 0, "leased_until": now}]
    until = now + timedelta(seconds=20)
    with pytest.raises(sa.exc.DBAPIError) as refused:
        lease._start_on(source, {shard}, on_jobs, rows, until, now, retried=False)
    assert is_fence_error(refused.value)
    beat = [{"run_id": rows[0]["run_id"], "lease_token": rows[0]["lease_token"]}]
    with pytest.raises(sa.exc.DBAPIError) as refused:
        lease._heartbeat_on(source, {shard}, beat, {"leased_until": until})
    assert is_fence_error(refused.value)
    # And a completion, whose fence is read with the job rows it locks (none are there).
    gone = DispatchRun(
        run_id=on_jobs[0]["run_id"],
        job_id=on_jobs[0]["job_id"],
        shard=shard,
        owner="o",
        origin="schedule",
        lease_token=on_jobs[0]["lease_token"],
        scheduled_for=now,
        attempt=1,
        target={},
        retry={},
        payload=None,
    )
    with pytest.raises(sa.exc.DBAPIError) as refused, source.begin() as conn:
        apply(
            conn,
            [Finished(gone, CallOutcome(status_code=200), now)],
            now,
            random.random,
            20,
            refuse_moved={shard},
        )
    assert is_fence_error(refused.value)
    # A shard the source still serves: the same writes go through (and match nothing).
    kept = registry.routing().shards_of(here)[0]
    assert lease._start_on(source, {kept}, on_jobs, rows, until, now, retried=False) == []
    assert lease._heartbeat_on(source, {kept}, beat, {"leased_until": until}) == []


def test_a_shard_moves_back_onto_a_database_it_left(registry):
    fill(registry, 1, 20)
    home_of_1 = registry.reload_map().shard_index[1]
    mover.move_shard(registry, 1, 2)
    mover.move_shard(registry, 1, home_of_1)
    assert registry.reload_map().shard_index[1] == home_of_1
    assert len(rows_of(registry.engines[home_of_1], 1)[0]) >= 20
    assert fence_of(registry.engines[home_of_1], 1) is None


def test_writes_made_during_the_move_all_arrive(registry):
    shard = 5
    ids = sorted(fill(registry, shard, 400))
    stop = threading.Event()
    written: dict[uuid.UUID, int] = {}
    errors: list[BaseException] = []

    def write_forever():
        # As a worker does: through the map, waiting out the fence (for_each_database).
        step = 0
        try:
            while not stop.is_set():
                step += 1
                new = job_row(SHARDS, shard=shard, run_at=utcnow() + timedelta(days=2))
                changed = ids[step % len(ids)]

                def write(engine, items, step=step, new=new, changed=changed):
                    with engine.begin() as conn:
                        conn.execute(jobs.insert(), [new])
                        conn.execute(jobs.update().where(jobs.c.job_id == changed).values(attempt=step))
                        conn.execute(runs.delete().where(runs.c.job_id == changed, runs.c.state == "dead"))

                registry.for_each_database([shard], lambda s: s, write)
                written[new["job_id"]] = 0
                written[changed] = step
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    writer = threading.Thread(target=write_forever)
    writer.start()
    try:
        time.sleep(0.3)
        mover.move_shard(registry, shard, 2, batch=25)
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join(30)
    assert not errors, errors
    target = registry.engines[2]
    with target.connect() as conn:
        found = dict(
            conn.execute(sa.select(jobs.c.job_id, jobs.c.attempt).where(jobs.c.shard == shard)).all()
        )
        dead_left = set(
            conn.execute(
                sa.select(runs.c.job_id).where(runs.c.shard == shard, runs.c.state == "dead")
            ).scalars()
        )
    assert set(ids) <= set(found) and set(written) <= set(found)
    latest = {job_id: step for job_id, step in written.items() if step}
    assert all(found[job_id] == step for job_id, step in latest.items())
    assert not dead_left & set(latest)
    assert len(written) > 10  # the writer really wrote during the move


@pytest.mark.parametrize("fail_at", [2, 3, 4])
def test_a_move_interrupted_at_any_step_is_finished_by_running_it_again(registry, monkeypatch, fail_at):
    shard = {2: 6, 3: 7, 4: 0}[fail_at]
    ids = fill(registry, shard, 60)
    source_index = registry.reload_map().shard_index[shard]
    _fail_on_step(monkeypatch, fail_at)
    with pytest.raises(RuntimeError, match="interrupted"):
        mover.move_shard(registry, shard, 2, batch=25)
    monkeypatch.undo()
    registry.reload_map()  # the map is whole: every shard on a listed database
    mover.move_shard(registry, shard, 2, batch=25)
    assert registry.reload_map().shard_index[shard] == 2
    assert ids <= rows_of(registry.engines[2], shard)[0]
    assert rows_of(registry.engines[source_index], shard) == (set(), 0)


@pytest.mark.parametrize("fail_at", [2, 3])
def test_a_move_interrupted_before_its_switch_can_be_aborted(registry, monkeypatch, fail_at):
    shard = {2: 4, 3: 2}[fail_at]
    ids = fill(registry, shard, 60)
    source_index = registry.reload_map().shard_index[shard]
    _fail_on_step(monkeypatch, fail_at)
    with pytest.raises(RuntimeError, match="interrupted"):
        mover.move_shard(registry, shard, 2, batch=25)
    monkeypatch.undo()
    mover.abort_move(registry, shard)
    routing = registry.reload_map()
    assert routing.shard_index[shard] == source_index and routing.map.placements[shard].move_step is None
    assert rows_of(registry.engines[source_index], shard)[0] == ids
    assert rows_of(registry.engines[2], shard) == (set(), 0)
    assert fence_of(registry.engines[source_index], shard) is None
    with registry.engines[source_index].begin() as conn:  # the source takes the shard's writes again
        conn.execute(jobs.update().where(jobs.c.shard == shard).values(attempt=1))


def test_a_move_killed_with_sigkill_is_finished_by_running_it_again(registry, dsns):
    shard = next(s for s in range(SHARDS) if registry.reload_map().shard_index[s] != 2)
    ids = fill(registry, shard, 20_000)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PUNCTUAL_DATABASE_URLS": ",".join(dsns),
        "PUNCTUAL_SHARDS": str(SHARDS),
    }
    command = [sys.executable, "-m", "app.cli", "shards", "move", str(shard), "--to", "2"]
    first = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert first.stdout is not None
    first.stdout.readline()  # the move is recorded and its copy starts: kill it there
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    in_progress = registry.reload_map().map.placements[shard].move_step
    again = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    if in_progress is None:  # the copy was faster than the kill: the move had finished
        assert again.returncode == 1 and "is already on" in again.stderr
    else:
        assert again.returncode == 0, again.stderr
    assert registry.reload_map().shard_index[shard] == 2
    assert ids <= rows_of(registry.engines[2], shard)[0]


def _fail_on_step(monkeypatch, fail_at: int) -> None:
    """Make the fail_at-th map write of a move raise, as a crash right before it would."""
    real = mover._set_step
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError("interrupted")
        return real(*args, **kwargs)

    monkeypatch.setattr(mover, "_set_step", failing)


def test_two_moves_of_one_shard_do_not_run_at_once(registry):
    with mover._only_mover(registry, 7):
        with pytest.raises(mover.MoveError, match="another `punctual shards move` of shard 7 is running now"):
            mover.move_shard(registry, 7, 2)


def _moving(registry: Registry) -> tuple[int, int]:
    """A shard and a database it is not on (earlier tests moved shards around)."""
    routing = registry.reload_map()
    shard = 5
    return shard, 2 if routing.shard_index[shard] != 2 else 0


def test_a_change_uncommitted_when_the_mover_takes_its_key_arrives_once_it_commits(registry, monkeypatch):
    """A row changed during the copy and changed again by a transaction still open when
    the mover copies the recorded changes: the mover leaves that key (the open change
    holds it) and copies the row after the change commits, not the row before it."""
    shard, to_index = _moving(registry)
    job = job_row(SHARDS, shard=shard, run_at=utcnow() + timedelta(days=1))
    run = run_row(
        job_id=job["job_id"],
        shard=shard,
        owner=job["owner"],
        origin="schedule",
        scheduled_for=utcnow(),
        attempt=1,
        state="claimed",
        target=job["target"],
        retry={},
        now=utcnow(),
    )
    with registry.engine_for_shard(shard).begin() as conn:
        conn.execute(jobs.insert(), [job])
        conn.execute(runs.insert(), [run])
    of_run = runs.c.run_id == run["run_id"]
    real_copy, real_apply = mover._copy_shard, mover._apply_changes
    raced = []

    def copy_then_start(source, target, shard, batch):
        copied = real_copy(source, target, shard, batch)
        with source.begin() as conn:  # a worker's start, recorded: the run's key is in shard_changes
            conn.execute(runs.update().where(of_run).values(state="running"))
        return copied

    def apply_during_a_completion(source, target, shard):
        if raced:
            return real_apply(source, target, shard)
        with source.connect() as completion:  # the completion's UPDATE is done, its COMMIT not yet
            completion.execute(runs.update().where(of_run).values(state="succeeded", status_code=200))
            raced.append(real_apply(source, target, shard))
            completion.commit()
        return raced[0]

    monkeypatch.setattr(mover, "_copy_shard", copy_then_start)
    monkeypatch.setattr(mover, "_apply_changes", apply_during_a_completion)
    mover.move_shard(registry, shard, to_index)
    with registry.engines[to_index].connect() as conn:
        moved = conn.execute(sa.select(runs.c.state, runs.c.status_code).where(of_run)).one()
    assert tuple(moved) == ("succeeded", 200)
    assert raced == [0]  # the open change held the key: the mover left it for a later round


def test_a_start_hold_and_heartbeat_in_the_fence_wait_for_the_switch_and_write_where_the_shard_went(
    registry, monkeypatch
):
    shard, to_index = _moving(registry)
    now = utcnow()
    with registry.engine_for_shard(shard).begin() as conn:
        conn.execute(jobs.insert(), [job_row(SHARDS, shard=shard, run_at=now) for _ in range(3)])
    running, to_start, to_hold = claim_batch(
        registry.engine_for_shard(shard), shard, now, registry.settings
    ).runs
    assert lease.start(registry, [running], utcnow()) == {running.run_id}
    real_verify = mover._verified_counts
    in_fence = threading.Event()
    results: dict[str, object] = {}

    def verify_slowly(*args):
        in_fence.set()
        time.sleep(1.5)  # the worker's writes below are refused meanwhile
        return real_verify(*args)

    def worker_writes(name, write):
        in_fence.wait(30)
        try:
            results[name] = write()
        except BaseException as exc:  # reported by the test
            results[name] = exc

    later = utcnow() + timedelta(minutes=5)
    writes = {
        "start": lambda: lease.start(registry, [to_start], utcnow()),
        "hold": lambda: lease.hold(registry, [(to_hold, later)], utcnow()),
        "heartbeat": lambda: lease.heartbeat(registry, [running], utcnow()),
    }
    threads = [threading.Thread(target=worker_writes, args=item) for item in writes.items()]
    for thread in threads:
        thread.start()
    monkeypatch.setattr(mover, "_verified_counts", verify_slowly)
    mover.move_shard(registry, shard, to_index)
    for thread in threads:
        thread.join(30)
    assert results == {"start": {to_start.run_id}, "hold": 1, "heartbeat": {running.run_id}}
    with registry.engines[to_index].connect() as conn:
        states = dict(
            conn.execute(
                sa.select(runs.c.run_id, runs.c.state).where(
                    runs.c.run_id.in_([running.run_id, to_start.run_id, to_hold.run_id])
                )
            ).all()
        )
        held_job = conn.execute(
            sa.select(jobs.c.state, jobs.c.next_run_at).where(jobs.c.job_id == to_hold.job_id)
        ).one()
    assert states == {running.run_id: "running", to_start.run_id: "running"}  # the held run is gone
    assert tuple(held_job) == ("scheduled", later)


def test_a_worker_whose_map_predates_a_finished_move_writes_where_the_shard_went(registry):
    """After the move deleted the shard's rows on the source, a write there would change
    nothing and look stale; the source refuses it instead, and it goes to the target."""
    shard, to_index = _moving(registry)
    now = utcnow()
    with registry.engine_for_shard(shard).begin() as conn:
        conn.execute(jobs.insert(), [job_row(SHARDS, shard=shard, run_at=now) for _ in range(2)])
    running, to_start = claim_batch(registry.engine_for_shard(shard), shard, now, registry.settings).runs
    assert lease.start(registry, [running], utcnow()) == {running.run_id}
    old_maps = [Registry(registry.settings) for _ in range(3)]  # workers that read the map before the move
    for old in old_maps:
        old.map_refresh_s = 3600
        old.routing()
    mover.move_shard(registry, shard, to_index)
    starter, beater, completer = old_maps
    try:
        assert starter.routing().shard_index[shard] != to_index
        assert lease.start(starter, [to_start], utcnow()) == {to_start.run_id}
        assert lease.heartbeat(beater, [running], utcnow()) == {running.run_id}
        report = complete(completer, [Finished(running, CallOutcome(status_code=200), utcnow())], utcnow())
        assert (report.applied, report.stale) == (1, 0)
    finally:
        for old in old_maps:
            old.dispose()
    with registry.engines[to_index].connect() as conn:
        states = dict(
            conn.execute(
                sa.select(runs.c.run_id, runs.c.state).where(
                    runs.c.run_id.in_([running.run_id, to_start.run_id])
                )
            ).all()
        )
    assert states == {running.run_id: "succeeded", to_start.run_id: "running"}
