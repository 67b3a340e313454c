"""The registry's connections: one SQLAlchemy engine per physical DSN.

Logical shard s lives on DSN s mod N (see app.registry.sharding). Postgres DSNs are plain
`postgresql://` URLs; Punctual picks psycopg 3 as the driver. The embedded SQLite
file is opened in WAL mode with a busy timeout so the API, the poller and the
worker of `punctual dev` can share it.
"""
from __future__ import annotations

import threading
from functools import cached_property

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from app.registry.sharding import physical_index
from app.settings import Settings


def engine_url(dsn: str) -> sa.URL:
    url = make_url(dsn)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def create_engine_for(dsn: str, pool_size: int = 10) -> Engine:
    url = engine_url(dsn)
    if url.get_backend_name() == "sqlite":
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_pre_ping=False,
        )

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            # pysqlite's own transaction handling defers BEGIN; take the write lock
            # at BEGIN instead so two writers queue on busy_timeout, not deadlock.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            # An AUTOCOMMIT connection (the API's one-statement insert) commits each
            # statement itself; a BEGIN here would open a transaction that nobody
            # commits, and the pool's reset-on-return would roll the write back.
            if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


class Registry:
    """Engines for every physical shard of one Settings, created lazily, shared per process."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._lock = threading.Lock()

    @cached_property
    def engines(self) -> tuple[Engine, ...]:
        return tuple(create_engine_for(dsn, self.settings.db_pool_size) for dsn in self.settings.database_urls)

    def database_index(self, shard: int) -> int:
        """Which DSN (index into PUNCTUAL_DATABASE_URLS) holds logical shard `shard`."""
        return physical_index(shard, len(self.settings.database_urls))

    def engine_for_shard(self, shard: int) -> Engine:
        return self.engines[self.database_index(shard)]

    @property
    def home(self) -> Engine:
        """The DSN of logical shard 0: owners and API keys live there."""
        return self.engine_for_shard(0)

    @property
    def is_sqlite(self) -> bool:
        return self.settings.embedded

    def dispose(self) -> None:
        if "engines" in self.__dict__:
            for engine in self.engines:
                engine.dispose()
            del self.__dict__["engines"]


_registries: dict[Settings, Registry] = {}
_registries_lock = threading.Lock()


def registry_for(settings: Settings) -> Registry:
    """The process-wide Registry for these settings (engines and their pools are reused)."""
    with _registries_lock:
        registry = _registries.get(settings)
        if registry is None:
            registry = _registries[settings] = Registry(settings)
        return registry
