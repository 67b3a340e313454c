"""Every bulk write can be found by its SQL (app.registry.bulk).

The integration tier checks each statement a test issues against its caller's
docstring (tests/conftest.py); this checks, without a database, that every call of
update_many / insert_many in app/ sits in a function whose docstring shows a statement
on the same table, and that the documented form is what update_many sends.
"""

from __future__ import annotations

import ast
import pathlib

from app.registry.bulk import insert_new_sql, insert_sql, state_in, update_sql
from app.registry.schema import jobs, runs

APP = pathlib.Path(__file__).resolve().parents[2] / "app"


def _bulk_calls():
    for path in sorted(APP.rglob("*.py")):
        if path.name == "bulk.py":  # the writes themselves, not a caller
            continue
        tree = ast.parse(path.read_text())
        # Module functions and methods; a function nested in one (a per-database write
        # handed to Registry.for_each_database) is documented by the one it is in.
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        tops = [n for n in tree.body if isinstance(n, defs)]
        tops += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, defs)]
        for func in tops:
            for node in ast.walk(func):
                verb = getattr(node.func, "id", None) if isinstance(node, ast.Call) else None
                # update_many(conn, table, ...), insert_many(conn, table, ...), and the
                # parts of update_together: Update(table, ...).
                place = {"update_many": 1, "insert_many": 1, "Update": 0}.get(verb or "")
                if place is None:
                    continue
                assert isinstance(node, ast.Call)
                arg = node.args[place] if len(node.args) > place else None
                table = arg.id if isinstance(arg, ast.Name) else None
                yield (
                    path.relative_to(APP.parent),
                    func,
                    "insert_many" if verb == "insert_many" else "update_many",
                    table,
                )


def test_every_bulk_call_shows_its_statement_in_the_docstring():
    calls = list(_bulk_calls())
    assert len(calls) >= 8  # claim (3), start (2), heartbeat (2), completion (3)
    for path, func, verb, table in calls:
        doc = " ".join((ast.get_docstring(func) or "").split())
        wanted = f"UPDATE {table} SET" if verb == "update_many" else f"INSERT INTO {table} ("
        assert table and wanted in doc, f"{path}:{func.lineno} {func.name}: docstring lacks `{wanted} ...`"


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


def test_a_write_that_locks_in_key_order_first_says_so_after_its_fence():
    sql = update_sql(jobs, ("job_id", "lease_token"), (), ("leased_until",), lock_in_key_order=True)
    assert sql.endswith(
        "AND v.lease_token IS NOT NULL AND jobs.job_id IN (SELECT job_id FROM jobs "
        "WHERE job_id = ANY(:keys) ORDER BY job_id FOR UPDATE);"
    )


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
