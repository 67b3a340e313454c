"""What differs between the two databases Punctual runs on, asked in one place.

Production is PostgreSQL. `punctual dev` keeps the registry in one SQLite file, which
has no row locks (one writer at a time holds the whole file, so FOR UPDATE and SKIP
LOCKED are left out there) and no JSONB or array parameters (app.registry.bulk falls
back to plain executemany).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection, Engine


def is_postgres(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "postgresql"


def locks_rows(bind: Engine | Connection) -> bool:
    """True where SELECT ... FOR UPDATE [SKIP LOCKED] means something."""
    return bind.dialect.name != "sqlite"
