"""`punctual migrate`: bring every database to the newest schema revision, then make
sure each carries its identity and the home the shard map (app.registry.shard_map).

Safe to repeat: Alembic records the revision in each database, so a second run
finds nothing to do, and the map is written only once. Migrations are forward-only
and live in migrations/ (installed as app/_migrations).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.registry.engines import create_engine_for
from app.registry.shard_map import establish


def _script_location() -> str:
    """Where env.py and versions/ are: the package app._migrations.

    The repository keeps them in migrations/; setup.cfg installs that directory as
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


def migrate_schema(dsns: tuple[str, ...]) -> list[tuple[str, str | None, str]]:
    """Upgrade every DSN's schema, nothing else; returns (dsn, before, after) for each.

    A database migrated this way belongs to no cluster yet (tests clone one as a
    template); `migrate_all` is what an operator runs."""
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


def migrate_all(
    dsns: tuple[str, ...], *, shards: int, echo: Callable[[str], None] = lambda _line: None
) -> list[tuple[str, str | None, str]]:
    """Upgrade every DSN, then `establish_cluster`; returns (dsn, before, after) for each."""
    results = migrate_schema(dsns)
    establish_cluster(dsns, shards, echo)
    return results


def establish_cluster(
    dsns: tuple[str, ...], shards: int, echo: Callable[[str], None] = lambda _line: None
) -> None:
    """Give each database its identity and, the first time, write the shard map
    (app.registry.shard_map.establish); `echo` gets a line per thing done. Raises
    ShardMapError when the list and the stored map disagree."""
    engines = [create_engine_for(dsn, pool_size=1) for dsn in dsns]
    try:
        for line in establish(engines, shards):
            echo(line)
    finally:
        for engine in engines:
            engine.dispose()
