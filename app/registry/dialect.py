"""What differs between the two databases Punctual runs on, asked in one place.

Production is PostgreSQL. `punctual dev` keeps the registry in one SQLite file, which
has no row locks (one writer at a time holds the whole file, so FOR UPDATE and SKIP
LOCKED are left out there) and no JSONB or array parameters (app.registry.bulk falls
back to plain executemany, and a label selector reads the JSON text by path).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine


def is_postgres(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "postgresql"


def locks_rows(bind: Engine | Connection) -> bool:
    """True where SELECT ... FOR UPDATE [SKIP LOCKED] means something."""
    return bind.dialect.name != "sqlite"


def carries_labels(bind: Engine | Connection, column: sa.ColumnElement, selector: Mapping[str, str]):
    """`column` (a labels object) holds every pair of `selector`.

    PostgreSQL: one containment test, `labels @> '{"team": "billing"}'::jsonb`, which
    ix_jobs_labels (GIN, jsonb_path_ops) serves. SQLite: one json_extract per pair
    (label keys never need quoting inside the path's double quotes: app.core.labels).
    """
    if is_postgres(bind):
        document = sa.cast(sa.literal(json.dumps(dict(selector), sort_keys=True)), postgresql.JSONB)
        return column.op("@>")(document)
    return sa.and_(
        sa.true(),
        *(sa.func.json_extract(column, f'$."{key}"') == value for key, value in selector.items()),
    )


def random_uuid(bind: Engine | Connection) -> sa.ColumnElement:
    """A new random UUID per row, made by the database (an UPDATE that gives each of
    many rows a lease token of its own): gen_random_uuid() on PostgreSQL, 16 random
    bytes as the 32 hex digits SQLAlchemy stores a UUID as on SQLite."""
    if is_postgres(bind):
        return sa.func.gen_random_uuid()
    return sa.func.lower(sa.func.hex(sa.func.randomblob(16)))
