"""A fenced write is one key lookup a row, even while the partial indexes are stale.

The state a burst leaves: the jobs were registered and ANALYZEd with no lease (so
ix_jobs_leased and ix_runs_leased were empty at the last ANALYZE), then claimed all at
once. PostgreSQL costs those indexes as empty, and a fence written as `lease_token =
v.lease_token` or `state = 'running'` (implying their predicates) was planned as a
scan of every leased row (app.registry.bulk's docstring). The first test checks that
this premise holds here, so that the others can fail: written the old way, the plans
use the partial indexes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from app.lifecycle.lease import _RELEASE_JOB
from app.registry.bulk import Update, _update_statement, locked_in_key_order, state_in
from app.registry.engines import create_engine_for
from app.registry.schema import jobs, runs

pytestmark = pytest.mark.integration

JOBS = 20_000
BATCH = 100


@pytest.fixture(scope="module")
def burst(pg_dsns):
    """20,000 one-off jobs, ANALYZEd while none had a lease, then all claimed: (engine, the
    first batch's (job_id, run_id, lease_token))."""
    engine = create_engine_for(pg_dsns[0], pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"""
            INSERT INTO jobs (job_id, shard, owner, name, target, schedule_kind, run_at, timezone,
                retry_max_attempts, retry_backoff_s, retry_max_backoff_s, misfire, dst_gap, dst_overlap,
                jitter_s, state, next_run_at, nominal_at, attempt, created_at, updated_at)
            SELECT md5(i::text)::uuid, mod(i, 16), 'owner', 'job-' || i,
                   '{{"type": "webhook", "url": "https://example.com/"}}'::jsonb, 'once', now(), 'UTC',
                   5, 10, 3600, 'run_once', 'shift', 'once', 0, 'scheduled', now(), now(), 0, now(), now()
            FROM generate_series(1, {JOBS}) AS i
            """
        )
        conn.exec_driver_sql("ANALYZE jobs; ANALYZE runs")
        conn.exec_driver_sql(
            "UPDATE jobs SET state = 'running', lease_token = md5('lease' || job_id::text)::uuid, "
            "leased_until = now() + interval '10 minutes'"
        )
        conn.exec_driver_sql(
            """
            INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state,
                lease_token, leased_until, published, created_at, updated_at)
            SELECT md5('run' || job_id::text)::uuid, job_id, shard, owner, 'schedule', now(), 1, 'claimed',
                   lease_token, leased_until, true, now(), now()
            FROM jobs
            """
        )
        batch = conn.execute(
            sa.select(runs.c.job_id, runs.c.run_id, runs.c.lease_token).order_by(runs.c.run_id).limit(BATCH)
        ).all()
    yield engine, batch
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE runs; DELETE FROM jobs")
    engine.dispose()


def _plan(engine: sa.Engine, sql: str, params: dict) -> str:
    with engine.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + sql, params).scalars())
        conn.rollback()
    return plan


def _jobs_lease(batch) -> Update:
    rows = [{"job_id": job_id, "lease_token": token} for job_id, _, token in batch]
    return Update(jobs, rows, match=("job_id", "lease_token"), constants={"leased_until": datetime.now(UTC)})


def _runs_start(batch, where: str) -> Update:
    rows = [{"run_id": run_id, "lease_token": token} for _, run_id, token in batch]
    return Update(
        runs,
        rows,
        match=("run_id", "lease_token"),
        constants={"state": "running"},
        where=where,
        returning="run_id",
    )


def test_the_premise_written_the_old_way_the_fences_scan_the_partial_indexes(burst):
    engine, batch = burst
    sql, params = _update_statement(_jobs_lease(batch))
    old = sql.replace(
        "jobs.lease_token IS NOT DISTINCT FROM v.lease_token", "jobs.lease_token = v.lease_token"
    )
    assert "ix_jobs_leased" in _plan(engine, old, params)
    sql, params = _update_statement(_runs_start(batch, "runs.state = 'claimed'"))
    old = sql.replace(
        "runs.lease_token IS NOT DISTINCT FROM v.lease_token", "runs.lease_token = v.lease_token"
    )
    assert "ix_runs_leased" in _plan(engine, old, params)


def test_a_start_heartbeat_or_completion_of_jobs_looks_each_job_up_by_its_key(burst):
    engine, batch = burst
    plan = _plan(engine, *_update_statement(_jobs_lease(batch)))
    assert "pk_jobs" in plan and "ix_jobs_leased" not in plan, plan


@pytest.mark.parametrize("states", [("claimed",), ("running",), ("claimed", "running")])
def test_a_fenced_write_of_runs_looks_each_run_up_by_its_key(burst, states):
    engine, batch = burst
    plan = _plan(engine, *_update_statement(_runs_start(batch, state_in(runs, states))))
    assert "pk_runs" in plan and "ix_runs_leased" not in plan, plan


def test_releasing_one_held_job_looks_it_up_by_its_key(burst):
    engine, batch = burst
    job_id, _, token = batch[0]
    compiled = _RELEASE_JOB.compile(dialect=postgresql.dialect())
    params = {"b_job_id": job_id, "b_token": token, "b_at": datetime.now(UTC), "b_now": datetime.now(UTC)}
    sql = str(compiled) % {name: f"%({name})s" for name in compiled.params}
    plan = _plan(engine, sql, {**compiled.params, **params})
    assert "pk_jobs" in plan and "ix_jobs_leased" not in plan, plan


def test_a_fence_matches_only_the_token_it_names(burst):
    """IS NOT DISTINCT FROM is no looser than equality here: a row without a token (or
    another one) is not matched, and a batch row without a token matches nothing."""
    engine, batch = burst
    (job_id, _, token), (other_job, _, _) = batch[0], batch[1]
    rows = [
        {"job_id": job_id, "lease_token": uuid.uuid4()},  # a stale token
        {"job_id": other_job, "lease_token": None},  # never sent, but must not match a released job
    ]
    with engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job_id == other_job).values(lease_token=None))
        update = Update(
            jobs, rows, match=("job_id", "lease_token"), constants={"attempt": 99}, returning="job_id"
        )
        sql, params = _update_statement(update)
        assert conn.exec_driver_sql(sql, params).all() == []
        conn.rollback()
    assert token is not None


def _analyzed(engine: sa.Engine, sql: str, params: dict) -> str:
    """The plan of `sql` as it ran, in a transaction rolled back."""
    with engine.connect() as conn:
        plan = "\n".join(
            conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, params).scalars()
        )
        conn.rollback()
    return plan


def _locking_completion(burst) -> tuple[str, dict]:
    """A completion's shape (statements.FINISH_RUNS: fenced, its state checked, its rows
    locked in key order first) over a batch twice the recordset's estimate of 100 rows."""
    engine, _ = burst
    with engine.connect() as conn:
        batch = conn.execute(
            sa.select(runs.c.run_id, runs.c.lease_token).order_by(runs.c.run_id.desc()).limit(2 * BATCH)
        ).all()
    rows = [{"run_id": run_id, "lease_token": token, "error": None} for run_id, token in batch]
    update = Update(
        runs,
        rows,
        match=("run_id", "lease_token"),
        columns=("error",),
        constants={"state": "succeeded"},
        where=state_in(runs, ("claimed",)),
        returning="run_id",
        lock_in_key_order=True,
    )
    return _update_statement(update)


def _times_each_ran(plan: str, node: str) -> list[int]:
    return [int(line.rsplit("loops=", 1)[1].rstrip(")")) for line in plan.splitlines() if node in line]


def test_the_premise_written_the_old_way_a_locking_write_joins_every_row_to_every_row(burst):
    """The lock as `key IN (SELECT ... FOR UPDATE)`, the state check beside the key: its
    LockRows ran once for every row written, or the recordset was read again for each."""
    engine, _ = burst
    sql, params = _locking_completion(burst)
    keys, checked = "CAST(%(keys)b AS uuid[])", state_in(runs, ("claimed",))
    lock = locked_in_key_order(runs, "run_id", keys, checked)
    assert lock in sql
    old = sql.replace(
        lock,
        f"runs.run_id = ANY({keys}) AND {checked} AND runs.run_id IN "
        f"(SELECT run_id FROM runs WHERE run_id = ANY({keys}) ORDER BY run_id FOR UPDATE)",
    )
    plan = _analyzed(engine, old, params)
    rescans = _times_each_ran(plan, "LockRows") + _times_each_ran(plan, "Function Scan on jsonb_to_recordset")
    assert max(rescans) > 1, plan


def test_a_write_that_locks_in_key_order_reads_its_batch_and_locks_its_rows_once(burst):
    engine, _ = burst
    plan = _analyzed(engine, *_locking_completion(burst))
    assert "InitPlan" in plan and "rows=200 loops=1" in plan, plan
    assert _times_each_ran(plan, "LockRows") == [1], plan
    assert _times_each_ran(plan, "Function Scan on jsonb_to_recordset") == [1], plan
    assert "ix_runs_leased" not in plan, plan
