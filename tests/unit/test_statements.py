"""The named bulk statements (app.registry.statements): each renders as its snapshot
(tests/snapshots/sql/<name>.sql), app/ writes in bulk only through them, and the rows
app/ shapes are the rows the inserts name."""

from __future__ import annotations

import ast
import difflib
import pathlib
import uuid
from datetime import UTC, datetime

import pytest

from app.registry import statements
from app.registry.records import run_row
from app.registry.statements import INSERT_NEW_JOBS, INSERT_RUNS, SETTLE_JOBS, STATEMENTS
from tests import snapshots
from tests.rows import job_row

APP = pathlib.Path(__file__).resolve().parents[2] / "app"
# The bulk writes by shape; app/ reaches them through app.registry.statements only.
_BY_SHAPE = {"update_many", "insert_many", "insert_new", "write", "Update", "LeasedInsert"}


@pytest.mark.parametrize("statement", STATEMENTS, ids=lambda statement: statement.name)
def test_each_statement_renders_as_its_snapshot(statement):
    path = snapshots.path_of(statement)
    stored = path.read_text() if path.exists() else ""
    rendered = snapshots.render(statement)
    diff = difflib.unified_diff(stored.splitlines(True), rendered.splitlines(True), path.name, "rendered")
    assert rendered == stored, (
        f"{statement.name} no longer renders as {path.name}; if the change is meant, "
        f"run `{snapshots.UPDATE_COMMAND}` and review the diff:\n{''.join(diff)}"
    )


def test_every_snapshot_is_of_a_statement():
    named = {snapshots.path_of(statement) for statement in STATEMENTS}
    stale = set(snapshots.SQL_DIR.glob("*.sql")) - named
    assert not stale, (
        f"snapshots of no statement: {sorted(p.name for p in stale)}; run `{snapshots.UPDATE_COMMAND}`"
    )


def test_every_statement_has_its_own_name_and_is_listed():
    names = [statement.name for statement in STATEMENTS]
    assert len(names) == len(set(names))
    kinds = (statements.BulkUpdate, statements.BulkInsert, statements.BulkLeasedInsert)
    declared = [value for value in vars(statements).values() if isinstance(value, kinds)]
    assert {id(value) for value in declared} == {id(statement) for statement in STATEMENTS}


def test_app_writes_in_bulk_only_through_the_named_statements():
    found = []
    for path in sorted(APP.rglob("*.py")):
        if path.relative_to(APP).as_posix() in ("registry/bulk.py", "registry/statements.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "app.registry.bulk":
                found += [f"{path}: imports {a.name}" for a in node.names if a.name in _BY_SHAPE]
            if isinstance(node, ast.Attribute) and node.attr in _BY_SHAPE:
                if isinstance(node.value, ast.Name) and node.value.id == "bulk":
                    found.append(f"{path}:{node.lineno}: bulk.{node.attr}")
    assert not found, "bulk writes not named in app.registry.statements:\n" + "\n".join(found)


def test_no_module_of_app_repeats_a_statement_in_its_text():
    repeated = [
        str(path.relative_to(APP))
        for path in sorted(APP.rglob("*.py"))
        if path.name != "bulk.py" and "jsonb_to_recordset(:rows)" in path.read_text()
    ]
    assert not repeated


def test_a_new_run_row_carries_the_columns_insert_runs_names():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = run_row(
        job_id=uuid.uuid4(),
        shard=0,
        owner="o",
        origin="schedule",
        scheduled_for=now,
        attempt=1,
        state="claimed",
        target={},
        retry={},
        now=now,
    )
    assert tuple(row) == INSERT_RUNS.columns


def test_a_new_job_row_carries_the_columns_insert_new_jobs_names():
    assert tuple(job_row(1, run_at=datetime(2026, 1, 1, tzinfo=UTC))) == INSERT_NEW_JOBS.columns


def test_a_batch_sets_only_columns_and_constants_its_statement_names():
    rows = [{"job_id": uuid.uuid4(), "lease_token": uuid.uuid4(), "state": "scheduled"}]
    narrowed = SETTLE_JOBS.of(rows, {"updated_at": None}, ["state"])
    assert (narrowed.columns, narrowed.match) == (["state"], SETTLE_JOBS.match)
    with pytest.raises(ValueError, match="settle_jobs sets no \\['owner'\\]"):
        SETTLE_JOBS.of(rows, {"updated_at": None}, ["state", "owner"])
    with pytest.raises(ValueError, match="settle_jobs binds no \\['shard'\\]"):
        SETTLE_JOBS.of(rows, {"shard": 1})
