"""`punctual migrate`: every physical DSN, repeatable, and the result equals the metadata."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.registry.engines import create_engine_for
from app.registry.migrate import head_revision
from app.registry.schema import metadata
from tests.conftest import _pg_url, create_database, drop_database

pytestmark = pytest.mark.integration


@pytest.fixture
def two_empty_databases(pg_admin):
    names = [create_database(pg_admin) for _ in range(2)]
    yield [_pg_url(n) for n in names]
    for name in names:
        drop_database(pg_admin, name)


def _punctual(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )


def _schema_diff(dsn: str) -> list:
    engine = create_engine_for(dsn, pool_size=1)

    def made_here(obj, _name, _type, reflected, _compare_to) -> bool:
        # An object the metadata makes for one dialect only (`ddl_if`, such as a GIN
        # index) is not expected on the others.
        wanted = getattr(obj, "_ddl_if", None)
        return reflected or wanted is None or wanted.dialect in (None, engine.dialect.name)

    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "include_object": made_here}
            )
            with warnings.catch_warnings():
                # alembic hands the options of a reflected GIN index (ix_jobs_labels) back to
                # SQLAlchemy under a name it does not validate: a warning, not a difference.
                warnings.filterwarnings("ignore", message="Can't validate argument 'dialect_options'")
                return compare_metadata(context, metadata)
    finally:
        engine.dispose()


def test_migrate_creates_the_schema_on_every_dsn_and_repeats_as_a_no_op(two_empty_databases):
    env = {"PUNCTUAL_DATABASE_URLS": ",".join(two_empty_databases)}
    first = _punctual("migrate", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count(f"empty -> {head_revision()}") == 2
    for dsn in two_empty_databases:
        assert _schema_diff(dsn) == []

    second = _punctual("migrate", env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("up to date") == 2
    assert "root@" in second.stdout  # DSNs are printed, passwords would be hidden


def test_migrated_sqlite_equals_the_metadata(tmp_path):
    env = {"PUNCTUAL_DATA_DIR": str(tmp_path / "data")}
    result = _punctual("migrate", env=env)
    assert result.returncode == 0, result.stderr
    assert _schema_diff(f"sqlite:///{(tmp_path / 'data' / 'registry.sqlite3')}") == []


def test_two_concurrent_migrations_do_not_collide(pg_admin):
    name = create_database(pg_admin)
    try:
        env = {"PUNCTUAL_DATABASE_URLS": _pg_url(name)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "app.cli", "migrate"],
                env={"PATH": os.environ["PATH"], **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
        assert all(code == 0 for _, _, code in results), results
        assert _schema_diff(_pg_url(name)) == []
    finally:
        drop_database(pg_admin, name)
