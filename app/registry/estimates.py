"""Row counts by state for the /metrics gauges: exact while a table is small, an
estimate from PostgreSQL's statistics once it is big.

A count(*) over a table of many millions of rows costs a scan every time the
gauges refresh. Above EXACT_BELOW rows (pg_class.reltuples, kept by autovacuum
and ANALYZE) the count is n_live_tup (pg_stat_user_tables, kept by every write)
times each state's share in pg_stats' most common values (kept by ANALYZE): a
figure as fresh as autovacuum's last analyze, at the cost of three catalog reads.
SQLite (`punctual dev`) always counts.
"""

from __future__ import annotations

import sqlalchemy as sa

from app.registry.dialect import is_postgres

EXACT_BELOW = 100_000


def counts_by_state(
    conn: sa.Connection, table: sa.Table, states: tuple[str, ...] | None = None
) -> dict[str, int]:
    """Rows of `table` per value of its `state` column (only `states`, when given)."""
    if is_postgres(conn):
        estimated = _estimate(conn, table.name)
        if estimated is not None:
            return {s: n for s, n in estimated.items() if states is None or s in states}
    query = sa.select(table.c.state, sa.func.count()).group_by(table.c.state)
    if states is not None:
        query = query.where(table.c.state.in_(states))
    return {state: count for state, count in conn.execute(query)}


def _estimate(conn: sa.Connection, name: str) -> dict[str, int] | None:
    """The estimate, or None while the table is small or never analyzed."""
    reltuples = conn.execute(
        sa.text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:name)"), {"name": name}
    ).scalar()
    if reltuples is None or reltuples < EXACT_BELOW:
        return None
    live = (
        conn.execute(
            sa.text("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = to_regclass(:name)"),
            {"name": name},
        ).scalar()
        or reltuples
    )
    row = conn.execute(
        sa.text(
            "SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats "
            "WHERE schemaname = current_schema() AND tablename = :name AND attname = 'state'"
        ),
        {"name": name},
    ).first()
    if row is None or row[0] is None:
        return None
    return {state: int(round(live * share)) for state, share in zip(row[0], row[1], strict=True)}
