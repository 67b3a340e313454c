"""Bulk writes: a whole batch of rows in ONE statement on PostgreSQL.

The hot path writes hundreds of rows at a time (claims, run rows, starts,
completions, heartbeats). Row-by-row executemany costs a parse, a bind and a round of
the pipeline per row; here the batch travels as one JSON document
(`UPDATE t SET c = v.c FROM jsonb_to_recordset(:rows) AS v(...) WHERE t.k = v.k AND
t.k = ANY(:keys)`, or `INSERT INTO t SELECT ... FROM jsonb_to_recordset(:rows)`), so a
batch is one statement with one parameter, whatever its size. They go to the driver as
they are (`exec_driver_sql`): a statement built for its batch has nothing for
SQLAlchemy's compiler to do. SQLite (embedded mode) gets the same writes as an
executemany: it has no arrays, and one process writing in-process does not need them.

The writes of app/ are named in app.registry.statements, each once; `update_sql` /
`insert_sql` render a statement's shape there, and the tests pin each rendering in a
snapshot.

A fenced write names its row by the table's key and checks the rest (the lease token,
the state) in a form that implies no partial index's predicate: the token by IS NOT
DISTINCT FROM, the state through coalesce (`state_in`, `state_among`). PostgreSQL
costs a partial index that was empty at the table's last ANALYZE as empty however many
rows it holds since, and a burst fills ix_jobs_leased and ix_runs_leased at once: a
predicate implying theirs made every write of a burst scan every leased row. Written
this way, the key's index is the only one the fence can use, and each row is one
lookup (tests/integration/test_indexes.py).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql, sqlite

from app.registry.dialect import is_postgres
from app.registry.engines import REFUSE_FENCED_CALL

_PG_TYPES = {
    sa.Uuid: "uuid",
    sa.Text: "text",
    sa.Boolean: "boolean",
    sa.SmallInteger: "smallint",
    sa.BigInteger: "bigint",
    sa.Integer: "integer",
    sa.Float: "double precision",
    sa.DateTime: "timestamptz",
}


@functools.cache  # a table's columns live as long as the process; every batch asks again
def _pg_type(column: sa.Column) -> str:
    kind = column.type
    impl = getattr(kind, "impl", kind)
    if isinstance(impl, (sa.JSON, postgresql.JSONB)) or isinstance(kind, sa.JSON):
        return "jsonb"
    for base, name in _PG_TYPES.items():  # exact types first: SmallInteger is an Integer too
        if type(impl) is base:
            return name
    for base, name in _PG_TYPES.items():
        if isinstance(impl, base):
            return name
    raise TypeError(f"no PostgreSQL type for column {column.name} ({kind!r})")


def _refuse_naive(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the registry; instants must be aware UTC")
    return value


def _json_default(value: Any) -> str:
    if isinstance(value, datetime):
        return _refuse_naive(value).isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot send {type(value).__name__} in a bulk write")


def _recordset(
    table: sa.Table, columns: Sequence[str], rows: Sequence[Mapping[str, Any]], prefix: str = ""
) -> tuple[str, dict]:
    """The `jsonb_to_recordset(...) AS v(col type, ...)` source of a batch and its one
    parameter (named `rows`, after `prefix`: several statements may share parameters).

    The whole batch travels as one JSON document, which Postgres parses into typed
    columns faster than a driver can bind row after row.
    """
    spec = ", ".join(f"{c} {_pg_type(table.c[c])}" for c in columns)
    for name in _instant_columns(table, tuple(columns)):
        for row in rows:
            if isinstance(value := row[name], datetime) and value.tzinfo is None:
                _refuse_naive(value)
    # A key left out is NULL in the recordset: None values need not travel.
    payload = _dumps([{c: row[c] for c in columns if row[c] is not None} for row in rows])
    return f"jsonb_to_recordset(CAST(%({prefix}rows)s AS jsonb)) AS v({spec})", {f"{prefix}rows": payload}


@functools.cache  # a statement's columns are a few fixed shapes
def _instant_columns(table: sa.Table, columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in columns if _pg_type(table.c[c]) == "timestamptz")


def _dumps(rows: list[dict]) -> str:
    """The batch as JSON. orjson writes UUIDs and datetimes itself: json.dumps called
    back into Python for each of them, and a burst's starts and completions carry four
    or five a row. What orjson refuses (an
    integer past 64 bits in an owner's payload) goes the standard library's way.
    """
    try:
        return orjson.dumps(rows, default=_json_default).decode()
    except orjson.JSONEncodeError:
        return json.dumps(rows, default=_json_default)


def _constant(table: sa.Table, name: str, index: int, value: Any, params: dict, prefix: str = "") -> str:
    """A value bound once for the whole batch: its placeholder, cast to the column's
    type, and its parameter (a datetime must be aware, as the column type demands)."""
    pg_type = _pg_type(table.c[name])
    if isinstance(value, datetime):
        _refuse_naive(value)
    params[f"{prefix}k{index}"] = Jsonb(value) if pg_type == "jsonb" and value is not None else value
    return f"CAST(%({prefix}k{index})s AS {pg_type})"


def _match_sql(
    table: sa.Table, match: Sequence[str], keys: str = ":keys", among: str | None = None
) -> list[str]:
    """`match`'s conditions: the key by equality and among the batch's `keys` (an
    index condition the planner costs by the batch's size, so that it looks each row
    up by the key rather than scan the table and hash the batch: with an index
    costed as empty, or a table ANALYZEd small, it did either), each fence column (a
    lease token: never null in a batch) by IS NOT DISTINCT FROM, which implies no
    partial index's predicate (the module's docstring). `among` replaces the batch's
    `keys` (a write that locks in key order names its rows by its locking sub-select)."""
    key, *fences = match
    among = among or f"{table.name}.{key} = ANY({keys})"
    return [f"{table.name}.{key} = v.{key}", among] + [
        f"{table.name}.{k} IS NOT DISTINCT FROM v.{k} AND v.{k} IS NOT NULL" for k in fences
    ]


def state_in(table: sa.Table, states: Sequence[str]) -> str:
    """`table.state` is one of `states`, as SQL for `where`, through coalesce so that it
    implies no partial index's predicate (the module's docstring). The states are the
    code's constants, never input."""
    quoted = ", ".join(f"'{state}'" for state in states)
    return f"coalesce({table.name}.state, '') IN ({quoted})"


def state_among(column: sa.Column, states: Sequence[str]) -> sa.ColumnElement:
    """`state_in` as a SQLAlchemy condition."""
    return sa.func.coalesce(column, "").in_(list(states))


def same_token(column: sa.Column, token: Any) -> sa.ColumnElement:
    """`column` holds the lease token `token` (never None), written as IS NOT DISTINCT
    FROM so that it implies no partial index's predicate (the module's docstring)."""
    return column.is_not_distinct_from(token)


def locked_in_key_order(table: sa.Table, key: str, keys: str = ":keys", where: str | None = None) -> str:
    """A condition that locks the batch's rows in key order before they are written,
    and names the rows the write may touch: those of `keys` for which `where` holds.

    An UPDATE locks rows in the order its plan meets them: a bitmap heap scan of the
    batch's keys meets them in the order they lie in the table. Two writers that meet
    the same rows in different orders can deadlock, and PostgreSQL breaks a deadlock
    only after deadlock_timeout (a second): the heartbeat (an UPDATE of every job in
    flight) and a completion (which locks its jobs in key order) did, once or twice a
    burst. The sub-select's LockRows sits above its sort, so the rows are locked in key
    order, as the completion and the hold lock theirs (tests/integration/
    test_lock_order.py).

    The sub-select is an ARRAY, run once before the write reads a row: as `key IN
    (SELECT ...)` it was the inner side of a nested loop, and its LockRows ran again
    for every row written (a batch of 200 locked 20,000 times). `where` (the state
    check) is tested there, on each row as locked, and not beside the key: next to the
    key, PostgreSQL estimated the batch at one row (it has no statistics of
    `coalesce(state, '')`) and joined the recordset to it by a nested loop, every row
    against every row. Alone, the key's array leaves the recordset hashed
    (tests/integration/test_fence_plans.py)."""
    checked = f" AND {where}" if where else ""
    return (
        f"{table.name}.{key} = ANY(ARRAY(SELECT {key} FROM {table.name} WHERE {key} = ANY({keys}){checked} "
        f"ORDER BY {key} FOR UPDATE))"
    )


def _conditions(
    table: sa.Table, match: Sequence[str], where: str | None, lock_in_key_order: bool, keys: str = ":keys"
) -> list[str]:
    """A bulk UPDATE's WHERE, in the order both its issued and its documented forms say it.
    A write that locks in key order names its rows by the locking sub-select alone
    (locked_in_key_order), its `where` inside it."""
    if lock_in_key_order:
        return _match_sql(table, match, keys, among=locked_in_key_order(table, match[0], keys, where))
    return _match_sql(table, match, keys) + ([where] if where else [])


def update_sql(
    table: sa.Table,
    match: Sequence[str],
    columns: Sequence[str] = (),
    constants: Sequence[str] = (),
    where: str | None = None,
    returning: str | None = None,
    lock_in_key_order: bool = False,
) -> str:
    """The statement `update_many` issues, as app.registry.statements renders it."""
    names = list(match) + [c for c in columns if c not in match]
    sets = [f"{c} = v.{c}" for c in columns] + [f"{c} = :{c}" for c in constants]
    conditions = _conditions(table, match, where, lock_in_key_order)
    sql = (
        f"UPDATE {table.name} SET {', '.join(sets)} FROM {_source_sql(table, names)} "
        f"WHERE {' AND '.join(conditions)}"
    )
    return sql + (f" RETURNING {table.name}.{returning}" if returning else "") + ";"


def insert_sql(table: sa.Table, columns: Sequence[str]) -> str:
    """The statement `insert_many` issues, as app.registry.statements renders it."""
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {', '.join(f'v.{c}' for c in columns)} "
        f"FROM {_source_sql(table, columns)};"
    )


def insert_new_sql(table: sa.Table, columns: Sequence[str], key: str) -> str:
    """The statement `insert_new` issues, as app.registry.statements renders it."""
    return insert_sql(table, columns).removesuffix(";") + f" ON CONFLICT ({key}) DO NOTHING RETURNING {key};"


def _source_sql(table: sa.Table, columns: Sequence[str]) -> str:
    return f"jsonb_to_recordset(:rows) AS v({', '.join(f'{c} {_pg_type(table.c[c])}' for c in columns)})"


@dataclass(frozen=True)
class Update:
    """One bulk UPDATE: `update_many`'s arguments, for `update_together`."""

    table: sa.Table
    rows: Sequence[Mapping[str, Any]]
    match: Sequence[str]
    columns: Sequence[str] = ()
    constants: Mapping[str, Any] = field(default_factory=dict)
    where: str | None = None
    returning: str | None = None
    # Lock the rows in key order first (locked_in_key_order): for a writer of rows
    # that another writer may be locking at the same time.
    lock_in_key_order: bool = False


@dataclass(frozen=True)
class LeasedInsert:
    """One bulk INSERT of rows that may exist only under a lease another table holds,
    for `update_together`: a row goes in only while its `lease_table` row (by `key`)
    holds the row's lease_token and is in one of `lease_states`, and those rows are
    locked FOR SHARE first (a writer holding one, a claim not yet committed, is waited
    for and the lease read as it left it). A row whose `conflict` key exists already takes
    the new row's `upsert` columns if it is in one of `upsert_states` under the same
    token, and is left as it is otherwise (a duplicate). Returns `conflict`."""

    table: sa.Table
    rows: Sequence[Mapping[str, Any]]
    columns: Sequence[str]  # per row: `key`, `conflict` and lease_token among them
    constants: Mapping[str, Any]
    lease_table: sa.Table
    key: str
    lease_states: Sequence[str]
    conflict: str
    upsert: Sequence[str]
    upsert_states: Sequence[str]

    @property
    def returning(self) -> str:
        return self.conflict

    @property
    def match(self) -> Sequence[str]:
        return (self.conflict,)


def leased_insert_sql(
    table: sa.Table,
    columns: Sequence[str],
    constants: Sequence[str],
    lease_table: sa.Table,
    key: str,
    lease_states: Sequence[str],
    conflict: str,
    upsert: Sequence[str],
    upsert_states: Sequence[str],
    source: str | None = None,
    values: Sequence[str] | None = None,
    keys: str = ":keys",
) -> str:
    """The statement a LeasedInsert issues (its shape, as app.registry.statements names it)."""
    if values is None:
        values = [f"v.{c}" for c in columns] + [f":{c}" for c in constants]
    lease, t = lease_table.name, table.name
    # The lease rows are locked in a subquery, in key order, before their token and state
    # are compared: compared first (in the join, or pushed into the subquery, which OFFSET
    # 0 forbids), a row a writer holds would be compared as it was before that writer
    # and skipped, not waited for (a claim publishing before its COMMIT).
    locked = (
        f"(SELECT {key}, lease_token, state FROM {lease} WHERE {key} = ANY({keys}) "
        f"ORDER BY {key} OFFSET 0 FOR SHARE) AS lease"
    )
    return (
        f"INSERT INTO {t} ({', '.join([*columns, *constants])}) SELECT {', '.join(values)} "
        f"FROM {source or _source_sql(table, columns)} "
        f"JOIN {locked} ON lease.{key} = v.{key} "
        f"WHERE lease.lease_token IS NOT DISTINCT FROM v.lease_token AND v.lease_token IS NOT NULL "
        f"AND coalesce(lease.state, '') IN ({', '.join(repr(state) for state in lease_states)}) "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in upsert)} "
        f"WHERE coalesce({t}.state, '') IN ({', '.join(repr(state) for state in upsert_states)}) "
        f"AND {t}.lease_token IS NOT DISTINCT FROM excluded.lease_token "
        f"RETURNING {t}.{conflict}"
    )


def _leased_insert_statement(part: LeasedInsert, prefix: str = "") -> tuple[str, dict]:
    source, params = _recordset(part.table, part.columns, part.rows, prefix)
    values = [f"v.{c}" for c in part.columns] + [
        _constant(part.table, name, i, value, params, prefix)
        for i, (name, value) in enumerate(part.constants.items())
    ]
    params[f"{prefix}keys"] = [row[part.key] for row in part.rows]
    keys = f"CAST(%({prefix}keys)b AS {_pg_type(part.lease_table.c[part.key])}[])"
    sql = leased_insert_sql(
        part.table,
        part.columns,
        list(part.constants),
        part.lease_table,
        part.key,
        part.lease_states,
        part.conflict,
        part.upsert,
        part.upsert_states,
        source,
        values,
        keys,
    )
    return sql, params


def _insert_each_leased(conn: sa.Connection, part: LeasedInsert) -> list:
    """SQLite: a LeasedInsert row by row (one writer: no lock to take)."""
    lease, table = part.lease_table, part.table
    done: list = []
    for row in part.rows:
        holder = conn.execute(
            sa.select(lease.c.lease_token, lease.c.state).where(lease.c[part.key] == row[part.key])
        ).first()
        if (
            holder is None
            or holder.lease_token != row["lease_token"]
            or holder.state not in part.lease_states
        ):
            continue
        values = {**{c: row[c] for c in part.columns}, **part.constants}
        found = conn.execute(
            sa.select(table.c.state, table.c.lease_token).where(table.c[part.conflict] == row[part.conflict])
        ).first()
        if found is None:
            conn.execute(table.insert().values(values))
        elif found.state in part.upsert_states and found.lease_token == row["lease_token"]:
            conn.execute(
                table.update()
                .where(table.c[part.conflict] == row[part.conflict])
                .values({c: values[c] for c in part.upsert})
            )
        else:
            continue
        done.append(row[part.conflict])
    return done


def update_many(
    conn: sa.Connection,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    match: Sequence[str],
    columns: Sequence[str] = (),
    constants: Mapping[str, Any] | None = None,
    where: str | None = None,
    returning: str | None = None,
) -> list:
    """Set `columns` from each row and `constants` on every row matched by `match`.

    `where` is an extra SQL condition on the table (e.g. `state_in(runs, ("claimed",))`);
    `returning` a column of the table to return for the rows updated.
    """
    return write(conn, Update(table, rows, match, columns, dict(constants or {}), where, returning))


def write(conn: sa.Connection, update: Update) -> list:
    """`update` as one statement (update_many's; app.registry.statements names them)."""
    if not update.rows:
        return []
    if not is_postgres(conn):
        return _update_each(conn, update)
    sql, params = _update_statement(update)
    result = conn.exec_driver_sql(sql, params)
    return list(result.scalars()) if update.returning else []


def update_together(
    conn: sa.Connection, updates: Sequence[Update | LeasedInsert], refuse_moved: Iterable[int] = ()
) -> list[list]:
    """Several bulk UPDATEs as ONE statement on PostgreSQL, behind the move fence of
    the shards in `refuse_moved` (app.registry.engines.refuse_moved_shards); returns
    each update's `returning` values ([] for one without). A worker's start and
    heartbeat write a few rows of jobs and of runs each time, and at a steady load one
    round trip each for BEGIN, the fence, every UPDATE and COMMIT was most of a
    dispatch task's time: on a connection in autocommit (engines.statement_connection)
    this is one round trip, and one transaction. Each update is a data-modifying CTE,
    and the SELECT reads them in the order given, after the fence's refusal (which
    aborts the whole statement):

        WITH w0 AS (UPDATE jobs ... RETURNING jobs.job_id), w1 AS (UPDATE runs ... RETURNING runs.run_id)
        SELECT punctual_refuse_fenced(CAST(%(shards)s AS smallint[])),
               ARRAY(SELECT job_id FROM w0), ARRAY(SELECT run_id FROM w1)

    PostgreSQL runs the CTEs as they are read, so rows are locked in that order (the
    callers put jobs before runs, the janitor's lock order); were it ever otherwise, a
    deadlock is a transient failure, and the write is sent again. On SQLite the
    updates run one after another in the caller's transaction (no fences there).
    """
    if not is_postgres(conn):  # (the fences are PostgreSQL's only)
        return [
            (
                _insert_each_leased(conn, update)
                if isinstance(update, LeasedInsert)
                else _update_each(conn, update)
            )
            if update.rows
            else []
            for update in updates
        ]
    ctes, reads, params = [], [], {}
    shards = sorted(set(refuse_moved))
    if shards:
        reads.append(REFUSE_FENCED_CALL)
        params["shards"] = shards
    sent = [index for index, update in enumerate(updates) if update.rows]
    for index in sent:
        update = updates[index]
        # Every part returns something, so that the SELECT reads (and runs) it in order.
        returning = update.returning or update.match[0]
        if isinstance(update, LeasedInsert):
            sql, part_params = _leased_insert_statement(update, prefix=f"w{index}_")
        else:
            sql, part_params = _update_statement(replace(update, returning=returning), prefix=f"w{index}_")
        ctes.append(f"w{index} AS ({sql})")
        reads.append(f"ARRAY(SELECT {returning} FROM w{index})")
        params.update(part_params)
    found: dict[int, list] = {}
    if sent:
        row = conn.exec_driver_sql(f"WITH {', '.join(ctes)} SELECT {', '.join(reads)}", params).one()
        found = dict(zip(sent, list(row)[1 if shards else 0 :], strict=True))
    return [list(found.get(index, ())) if update.returning else [] for index, update in enumerate(updates)]


def _update_statement(update: Update, prefix: str = "") -> tuple[str, dict]:
    """The PostgreSQL statement of one bulk UPDATE and its parameters (named after `prefix`)."""
    table, rows, match, columns = update.table, update.rows, update.match, update.columns
    shared = _shared_scalars(table, [c for c in columns if c not in match], rows)
    varying = [c for c in columns if c not in shared]
    constants = {**shared, **update.constants}
    names = list(match) + [c for c in varying if c not in match]
    source, params = _recordset(table, names, rows, prefix)
    sets = [f"{c} = v.{c}" for c in varying]
    for i, (name, value) in enumerate(constants.items()):
        sets.append(f"{name} = {_constant(table, name, i, value, params, prefix)}")
    key = match[0]
    params[f"{prefix}keys"] = [row[key] for row in rows]
    # In binary (`%b`): psycopg dumps a list in text one element at a time in Python,
    # and every run of a burst is in several such arrays on its way (a start, a
    # completion).
    keys = f"CAST(%({prefix}keys)b AS {_pg_type(table.c[key])}[])"
    conditions = _conditions(table, match, update.where, update.lock_in_key_order, keys)
    sql = f"UPDATE {table.name} SET {', '.join(sets)} FROM {source} WHERE {' AND '.join(conditions)}"
    if update.returning:
        sql += f" RETURNING {table.name}.{update.returning}"
    return sql, params


def insert_many(conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert rows that all have the same keys, in one statement."""
    if not rows:
        return
    if not is_postgres(conn):
        conn.execute(table.insert(), list(rows))
        return
    sql, params = _insert_select(table, rows, list(rows[0])[0])
    conn.exec_driver_sql(sql, params)


def insert_new(conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], key: str) -> set:
    """Insert the rows whose `key` is not taken yet, in one statement; returns the keys inserted.

    `INSERT ... SELECT ... ON CONFLICT (key) DO NOTHING RETURNING key`: a row whose key
    exists (or that a concurrent transaction is inserting: this one waits for it) is
    skipped, not an error. Rows go in key order, so two batches sharing keys take
    their row locks in the same order and cannot deadlock.
    """
    if not rows:
        return set()
    rows = sorted(rows, key=lambda row: str(row[key]))
    if not is_postgres(conn):
        statement = sqlite.insert(table).on_conflict_do_nothing(index_elements=[key]).returning(table.c[key])
        return {found for row in rows for found in conn.execute(statement, dict(row)).scalars()}
    sql, params = _insert_select(table, rows, key)
    sql += f" ON CONFLICT ({key}) DO NOTHING RETURNING {key}"
    return set(conn.exec_driver_sql(sql, params).scalars())


def _insert_select(table: sa.Table, rows: Sequence[Mapping[str, Any]], key: str) -> tuple[str, dict]:
    """`INSERT INTO t (...) SELECT ... FROM jsonb_to_recordset(...)` and its parameters.

    `key` always travels per row (the recordset needs one column); scalars shared by
    every row are bound once.
    """
    names = list(rows[0])
    shared = _shared_scalars(table, [name for name in names if name != key], rows)
    varying = [c for c in names if c not in shared]
    source, params = _recordset(table, varying, rows)
    values = [f"v.{c}" for c in varying]
    values += [_constant(table, name, i, value, params) for i, (name, value) in enumerate(shared.items())]
    columns = ", ".join(varying + list(shared))
    return f"INSERT INTO {table.name} ({columns}) SELECT {', '.join(values)} FROM {source}", params


def key_in(conn: sa.Connection, column: sa.Column, values: Sequence[Any]) -> sa.ColumnElement:
    """`column IN (values)` for a batch of keys: on PostgreSQL `column = ANY(:keys)`,
    one array parameter, so neither SQLAlchemy nor the driver handles one bind per
    key (with hundreds of keys that is most of the statement's cost)."""
    if not is_postgres(conn):
        return column.in_(list(values))
    if isinstance(column.type, sa.Uuid) and all(isinstance(value, uuid.UUID) for value in values):
        # As one array literal: a list of UUIDs is dumped element by element in Python;
        # the literal costs a join (a UUID's text needs no quoting).
        literal = sa.bindparam(f"{column.name}_keys", "{" + ",".join(map(str, values)) + "}", type_=sa.Text)
        return column == sa.any_(sa.cast(literal, postgresql.ARRAY(column.type)))
    return column == sa.any_(
        sa.bindparam(f"{column.name}_keys", list(values), type_=postgresql.ARRAY(column.type))
    )


def _shared_scalars(
    table: sa.Table, names: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Scalar columns with one value across the batch (a claim's shard, state, due_at,
    created_at, ...): bound once rather than encoded into every row of the document.
    JSON columns always travel per row."""
    if len(rows) < 2:
        return {}
    first = rows[0]
    return {
        name: first[name]
        for name in names
        if first[name] is not None
        and _pg_type(table.c[name]) != "jsonb"
        and all(row[name] == first[name] for row in rows)
    }


def _update_each(conn: sa.Connection, update: Update) -> list:
    """SQLite: the same update, row by row (with RETURNING when asked)."""
    table, rows, match, columns = update.table, update.rows, update.match, update.columns
    constants, where, returning = update.constants, update.where, update.returning
    stmt = sa.update(table).where(*[table.c[k] == sa.bindparam(f"m_{k}") for k in match])
    if where:
        stmt = stmt.where(sa.text(where))
    stmt = stmt.values({**{c: sa.bindparam(f"s_{c}") for c in columns}, **constants})
    found: list = []
    params = [{**{f"m_{k}": row[k] for k in match}, **{f"s_{c}": row[c] for c in columns}} for row in rows]
    if returning:
        stmt = stmt.returning(table.c[returning])
        for one in params:
            found.extend(conn.execute(stmt, one).scalars())
        return found
    conn.execute(stmt, params)
    return found
