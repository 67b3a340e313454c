"""Fixtures shared by every tier.

Unit tests need none of these. Integration and end-to-end tests get real services:
a fresh PostgreSQL database per test module, cloned from a migrated template made
once per session (two of them stand for two physical shards), a fresh RabbitMQ
vhost, and a unique Redis key prefix. Everything is dropped afterwards; nothing
depends on leftovers.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid

import pytest
import sqlalchemy as sa

from app.settings import Settings

PG_ADMIN_DSN = os.environ.get("PUNCTUAL_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")
AMQP_BASE = os.environ.get("PUNCTUAL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")
REDIS_URL = os.environ.get("PUNCTUAL_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _pg_url(database: str) -> str:
    return sa.engine.make_url(PG_ADMIN_DSN).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin():
    from app.registry.engines import engine_url

    engine = sa.create_engine(
        engine_url(PG_ADMIN_DSN), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    yield engine
    engine.dispose()


def create_database(pg_admin, template: str | None = None) -> str:
    name = f"pt_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"{clause}')
    return name


def drop_database(pg_admin, name: str) -> None:
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_template(pg_admin):
    """A migrated database that per-module databases are cloned from."""
    from app.registry.migrate import migrate_schema

    # The schema only: each clone becomes a database of its own cluster (pg_dsns).
    name = create_database(pg_admin)
    migrate_schema((_pg_url(name),))
    # CREATE DATABASE ... TEMPLATE needs no other session on the template.
    yield name
    drop_database(pg_admin, name)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The replica scripts/test made, else a port of this run's own for the one pg_replica makes.
REPLICA_PORT = int(os.environ.get("PUNCTUAL_TEST_PG_REPLICA_PORT") or _free_port())
REPLICA_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "pg-replica"
)


def replica_url(dsn: str) -> str:
    """`dsn` (a database of the test server) on its streaming replica."""
    return sa.engine.make_url(dsn).set(port=REPLICA_PORT).render_as_string(hide_password=False)


def replica_ctl(action: str) -> None:
    """scripts/pg-replica ACTION on the test replica's port (stop, start, up, down)."""
    subprocess.run([REPLICA_SCRIPT, action, str(REPLICA_PORT)], check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def pg_replica(pg_admin):
    """A streaming replica of the test server on REPLICA_PORT: the one scripts/test made
    (PUNCTUAL_TEST_PG_REPLICA_PORT), else one made here with scripts/pg-replica and
    removed afterwards. Skips, saying why, only where none can be made (not root, no
    Debian PostgreSQL binaries, a primary without wal_level=replica)."""
    made = False
    if "PUNCTUAL_TEST_PG_REPLICA_PORT" not in os.environ:
        done = subprocess.run(
            [REPLICA_SCRIPT, "up", str(REPLICA_PORT)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            pytest.skip(f"no streaming replica can be made here: {done.stderr.strip() or done.returncode}")
        made = True
    admin = replica_url(PG_ADMIN_DSN)
    engine = sa.create_engine(
        admin.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=sa.pool.NullPool
    )
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() is True
    engine.dispose()
    yield admin
    if made:
        replica_ctl("down")


@pytest.fixture(scope="module")
def pg_shards(request) -> int:
    """The logical shards of a module's cluster: its PG_SHARDS, else production's 16."""
    return getattr(request.module, "PG_SHARDS", 16)


@pytest.fixture(scope="module")
def pg_dsns(pg_admin, pg_template, pg_shards):
    """Two fresh, migrated databases, one cluster of `pg_shards` shards (shard s on the
    s mod 2-th, the first one home): the two physical shards of one module's tests."""
    from app.registry.migrate import establish_cluster

    names = [create_database(pg_admin, pg_template) for _ in range(2)]
    dsns = tuple(_pg_url(n) for n in names)
    establish_cluster(dsns, pg_shards)
    yield dsns
    from app.registry.engines import _registries

    for settings in list(_registries):
        if any(n in url for n in names for url in settings.database_urls):
            _registries.pop(settings).dispose()
    for name in names:
        drop_database(pg_admin, name)


@pytest.fixture(scope="module")
def amqp_url():
    """A fresh RabbitMQ vhost for one module, deleted afterwards."""
    vhost = f"pt_{uuid.uuid4().hex[:12]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(
        ["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
        check=True,
        capture_output=True,
    )
    yield f"{AMQP_BASE}/{vhost}"
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


@contextlib.contextmanager
def unique_redis_prefix(label: str = "test"):
    """A unique Redis key prefix; every key under it is deleted on exit."""
    import redis

    prefix = f"pt-{label}-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def redis_prefix():
    """A unique Redis key prefix for one test; every key under it is deleted afterwards."""
    with unique_redis_prefix() as prefix:
        yield prefix


@pytest.fixture
def pg_settings(pg_dsns, redis_prefix) -> Settings:
    """Settings on two real Postgres shards (16 logical shards), real Redis; no broker."""
    return Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_REDIS_URL": REDIS_URL,
            "PUNCTUAL_REDIS_PREFIX": redis_prefix,
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        }
    )


@pytest.fixture
def truncate(pg_dsns):
    """Empty every table of this module's databases (for tests that need a clean slate)."""
    from app.registry.engines import create_engine_for

    def _truncate() -> None:
        for dsn in pg_dsns:
            engine = create_engine_for(dsn, pool_size=1)
            with engine.begin() as conn:
                conn.exec_driver_sql("TRUNCATE jobs, runs, api_keys, owners")
            engine.dispose()

    return _truncate
