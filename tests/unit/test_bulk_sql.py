"""The shapes app.registry.bulk renders: what `update_sql` / `insert_sql` say is what
update_many and insert_many send (app.registry.statements names each write of app/,
tests/unit/test_statements.py pins each)."""

from __future__ import annotations

from app.registry.bulk import insert_new_sql, insert_sql, state_in, update_sql
from app.registry.schema import jobs, runs


def test_update_sql_is_the_shape_update_many_sends():
    sql = update_sql(
        runs, ("run_id", "lease_token"), ("lateness_ms",), ("state",), state_in(runs, ("claimed",)), "run_id"
    )
    assert sql == (
        "UPDATE runs SET lateness_ms = v.lateness_ms, state = :state "
        "FROM jsonb_to_recordset(:rows) AS v(run_id uuid, lease_token uuid, lateness_ms bigint) "
        "WHERE runs.run_id = v.run_id AND runs.run_id = ANY(:keys) "
        "AND runs.lease_token IS NOT DISTINCT FROM v.lease_token AND v.lease_token IS NOT NULL "
        "AND coalesce(runs.state, '') IN ('claimed') "
        "RETURNING runs.run_id;"
    )


def test_a_write_that_locks_in_key_order_names_its_rows_by_the_locking_sub_select():
    sql = update_sql(jobs, ("job_id", "lease_token"), (), ("leased_until",), lock_in_key_order=True)
    assert sql.endswith(
        "WHERE jobs.job_id = v.job_id AND jobs.job_id = ANY(ARRAY(SELECT job_id FROM jobs "
        "WHERE job_id = ANY(:keys) ORDER BY job_id FOR UPDATE)) "
        "AND jobs.lease_token IS NOT DISTINCT FROM v.lease_token AND v.lease_token IS NOT NULL;"
    )


def test_a_write_that_locks_in_key_order_checks_its_state_on_the_rows_it_locks():
    sql = update_sql(
        runs,
        ("run_id", "lease_token"),
        (),
        ("leased_until",),
        where=state_in(runs, ("running",)),
        lock_in_key_order=True,
    )
    assert (
        "runs.run_id = ANY(ARRAY(SELECT run_id FROM runs WHERE run_id = ANY(:keys) "
        "AND coalesce(runs.state, '') IN ('running') ORDER BY run_id FOR UPDATE))" in sql
    )
    # Beside the key, the state check made PostgreSQL estimate the batch at one row.
    assert "ANY(:keys) AND runs.lease_token" not in sql and sql.count("coalesce(") == 1


def test_insert_sql_lists_every_column_it_sends():
    assert insert_sql(jobs, ["job_id", "shard"]) == (
        "INSERT INTO jobs (job_id, shard) SELECT v.job_id, v.shard "
        "FROM jsonb_to_recordset(:rows) AS v(job_id uuid, shard smallint);"
    )


def test_insert_new_sql_skips_taken_keys_and_returns_the_inserted():
    assert insert_new_sql(jobs, ["job_id", "shard"], "job_id") == (
        "INSERT INTO jobs (job_id, shard) SELECT v.job_id, v.shard "
        "FROM jsonb_to_recordset(:rows) AS v(job_id uuid, shard smallint) "
        "ON CONFLICT (job_id) DO NOTHING RETURNING job_id;"
    )
