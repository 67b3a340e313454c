"""The SQL snapshots: each named bulk statement (app.registry.statements) as it
renders, one file per statement in sql/, compared by tests/unit/test_statements.py.

After a deliberate change to a statement, rewrite them and review the diff:

    .venv/bin/python -m tests.snapshots --update
"""

from __future__ import annotations

import pathlib
import textwrap

from app.registry.statements import STATEMENTS, BulkInsert, BulkLeasedInsert, BulkUpdate

SQL_DIR = pathlib.Path(__file__).resolve().parent / "sql"
UPDATE_COMMAND = ".venv/bin/python -m tests.snapshots --update"
# A clause that starts a line when it stands outside any parentheses.
_CLAUSES = (" SELECT ", " FROM jsonb_to_recordset(", " WHERE ", " AND ", " RETURNING ", " ON CONFLICT ")


def render(statement: BulkUpdate | BulkInsert | BulkLeasedInsert) -> str:
    """The statement's SQL, one top-level clause a line, long lines wrapped."""
    sql, depth, start, lines = statement.sql(), 0, 0, []
    for index, char in enumerate(sql):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char == " " and sql.startswith(_CLAUSES, index):
            lines.append(sql[start:index])
            start = index + 1
    lines.append(sql[start:])
    return "".join(textwrap.fill(line, 100, subsequent_indent="    ") + "\n" for line in lines)


def path_of(statement: BulkUpdate | BulkInsert | BulkLeasedInsert) -> pathlib.Path:
    return SQL_DIR / f"{statement.name}.sql"


def update() -> list[pathlib.Path]:
    """Write every statement's snapshot and remove those of statements that are gone;
    returns the files written."""
    SQL_DIR.mkdir(exist_ok=True)
    wanted = {path_of(statement): render(statement) for statement in STATEMENTS}
    for stale in set(SQL_DIR.glob("*.sql")) - set(wanted):
        stale.unlink()
    for path, text in wanted.items():
        path.write_text(text)
    return sorted(wanted)
