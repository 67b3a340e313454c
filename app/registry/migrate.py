"""`punctual migrate`: bring every physical shard to the newest schema revision.

Safe to repeat: Alembic records the revision in each database, so a second run
finds nothing to do. Migrations are forward-only and live in migrations/ (installed as
app/_migrations).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.registry.engines import create_engine_for


def _script_location() -> str:
    """Where env.py and versions/ are: the package app._migrations.

    The repository keeps them in migrations/; setup.py installs that directory as
    app/_migrations in a wheel and maps app._migrations onto it in an editable
    install, so nothing named `migrations` lands at the top of site-packages.
    Alembic reads the files by path. Running from a checkout that is not installed
    at all, the repository's directory is used.
    """
    spec = importlib.util.find_spec("app._migrations")
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return str(Path(__file__).resolve().parents[2] / "migrations")


SCRIPT_LOCATION = _script_location()


def _config(connection: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise RuntimeError(f"{SCRIPT_LOCATION} holds no migration")
    return head


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def migrate_engine(engine: sa.Engine) -> tuple[str | None, str]:
    """Upgrade one database to head; returns (revision before, revision after)."""
    before = current_revision(engine)
    with engine.begin() as connection:
        command.upgrade(_config(connection), "head")
    after = current_revision(engine)
    assert after is not None  # upgraded to head: there is a revision
    return before, after


def migrate_all(dsns: tuple[str, ...]) -> list[tuple[str, str | None, str]]:
    """Upgrade every DSN; returns (dsn, before, after) for each."""
    results = []
    for dsn in dsns:
        if dsn.startswith("sqlite:///"):
            Path(dsn.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine_for(dsn, pool_size=1)
        try:
            before, after = migrate_engine(engine)
        finally:
            engine.dispose()
        results.append((dsn, before, after))
    return results
