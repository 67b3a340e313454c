"""The registry's connections: one SQLAlchemy engine per physical DSN.

Which database serves a logical shard is the stored shard map (app.registry.shard_map),
read and followed by the Registry; databases are recognised by identity, not by
their place in PUNCTUAL_DATABASE_URLS. Postgres DSNs are plain
`postgresql://` URLs; Punctual picks psycopg 3 as the driver. The embedded SQLite
file is opened in WAL mode with a busy timeout so the API, the poller and the
worker of `punctual dev` can share it.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from app.registry.replicas import CONNECT_TIMEOUT_S, Replicas
from app.registry.shard_map import (
    UNREACHABLE,
    Routing,
    ShardMapError,
    find_home,
    read_identity,
    read_map,
    read_version,
    route,
)
from app.settings import Settings


def engine_url(dsn: str) -> sa.URL:
    url = make_url(dsn)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def replica_dsn(dsn: str) -> str:
    """A replica's DSN with a connect timeout (its own, if it has one): a replica that
    does not answer is skipped, not waited for."""
    url = make_url(dsn)
    if "connect_timeout" in url.query:
        return dsn
    return url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)}).render_as_string(
        hide_password=False
    )


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
    engine = sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)

    @sa.event.listens_for(engine, "checkout")
    def _drop_if_closed_by_server(dbapi_connection, _record, _proxy):
        # Instead of the pool's pre-ping, a SELECT 1 before every transaction (a round
        # trip each; at a steady load a dispatch task's start is one statement, so the
        # ping was half of it): a look at the socket. Raising DisconnectionError here
        # makes the pool connect anew and hand out that connection.
        if closed_by_server(dbapi_connection):
            raise sa.exc.DisconnectionError("the server closed this pooled connection while it was idle")

    @sa.event.listens_for(engine, "connect")
    def _end_stalled_transactions(dbapi_connection, _record):
        # A SET on each new connection, not `options` in connect_args, which would
        # replace any `options` the DSN itself carries.
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)}")
        dbapi_connection.commit()

    return engine


def closed_by_server(dbapi_connection) -> bool:
    """Whether PostgreSQL ended this idle connection: a restart, a failover,
    pg_terminate_backend or a server-side timeout each send an error and close the
    stream, so the socket has something to read. Nothing else arrives on an idle
    connection of Punctual's (no LISTEN, no query in flight), so a readable socket is
    a closed connection, and poll() with no wait tells without a round trip. (A peer
    that vanished without a word, a cut cable, is not seen: its first statement fails
    and is retried as any transient failure is, app.registry.transient.)"""
    if dbapi_connection.closed:
        return True
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # psycopg raises once the connection is broken
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


# A transaction of Punctual's that waits this long between two statements is ended by
# the server. Every transaction here is a few statements sent back to back, so only a
# process that stopped mid-transaction (SIGSTOP, a frozen VM, a partition) gets there,
# and its row locks must not outlive that: a poll stopped inside its claim holds the
# claimed rows FOR UPDATE, and every other poller skips them (SKIP LOCKED) for as long
# as it is stopped: a recurring job among them missed every occurrence while the
# worker was stopped.
IDLE_IN_TRANSACTION_S = 10


# How often a process asks the home database whether the shard map changed.
MAP_REFRESH_S = 2.0
# How long a write refused by a move's fence waits for the switch before it gives up:
# a completion (its outcome has nowhere else to go), and a worker's start or hold
# (LEASE_FENCE_WAIT_S: its dispatch message goes back to the broker after that, so a
# fence that outlasts it costs a redelivery, not a lease).
FENCE_WAIT_S = 60.0
LEASE_FENCE_WAIT_S = 5.0
# The SQLSTATE of a write refused by a move's fence (migration 0004's triggers).
FENCE_SQLSTATE = "PT409"

log = logging.getLogger("punctual.registry")
T = TypeVar("T")
R = TypeVar("R")


def is_fence_error(exc: BaseException) -> bool:
    """True when a database refused a write because its shard is being moved away."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == FENCE_SQLSTATE


def refuse_moved_shards(conn: sa.Connection, shards: Iterable[int]) -> None:
    """Raise the fence's refusal (SQLSTATE PT409) when this database no longer takes
    writes of one of `shards`, before a worker's write that may find no row to change
    (a process's map a moment old, after a move deleted the shard's rows here): such a
    write would change nothing and be taken for stale instead of going where the shard
    went. First in its transaction (migration 0006's function; PostgreSQL only, as the
    fences are):

    SELECT punctual_refuse_fenced(CAST(:shards AS smallint[]))
    """
    if conn.dialect.name == "postgresql":
        # To the driver as it is: it opens every write transaction of a worker.
        conn.exec_driver_sql(_REFUSE_FENCED, {"shards": sorted(set(shards))})


@contextmanager
def statement_connection(engine: Engine) -> Iterator[sa.Connection]:
    """A connection for a write that is one statement (app.registry.bulk.update_together).
    On PostgreSQL it is in autocommit: the statement is its own transaction, without
    the BEGIN and COMMIT round trips around it (a worker's start and heartbeat are
    each one such statement). On SQLite, a transaction as every write there: the
    statement is several."""
    if engine.dialect.name != "postgresql":
        with engine.begin() as conn:
            yield conn
        return
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


# The refusal as an expression (app.registry.bulk.update_together reads it in a SELECT).
REFUSE_FENCED_CALL = "punctual_refuse_fenced(CAST(%(shards)s AS smallint[]))"
_REFUSE_FENCED = f"SELECT {REFUSE_FENCED_CALL}"


class Registry:
    """Engines for every database of one Settings, created lazily, shared per process,
    and the shard map that says which of them serves each logical shard.

    The map is read from the home database at first use (a DSN list that disagrees
    with it raises ShardMapError, one line) and followed afterwards: its version is
    asked every MAP_REFRESH_S, and the map read again when it went up.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.map_refresh_s = MAP_REFRESH_S
        self._lock = threading.Lock()
        self._routing: Routing | None = None
        self._checked_at = 0.0

    @cached_property
    def engines(self) -> tuple[Engine, ...]:
        size = self.settings.db_pool_size
        return tuple(create_engine_for(dsn, size) for dsn in self.settings.database_urls)

    @cached_property
    def replicas(self) -> Replicas | None:
        """The replicas of PUNCTUAL_REPLICA_URLS (app.registry.replicas), or None."""
        if not self.settings.replica_urls:
            return None
        size = self.settings.db_pool_size
        return Replicas(
            self.settings.replica_urls,
            self.settings.replica_max_lag_s,
            lambda: self.engines,
            self.routing,
            lambda dsn: create_engine_for(replica_dsn(dsn), size),
        )

    def read(
        self,
        index: int,
        read: Callable[[sa.Connection], R],
        confirm: Callable[[R], bool] | None = None,
    ) -> R:
        """`read(conn)` for a read that may be a little stale (docs/api.md "Replica
        reads"): on a fresh replica of DSN `index` when there is one, else on the
        primary. A read the replica fails (it went away, a recovery conflict) is made
        again on the primary, and so is one whose result `confirm` rejects (a job not
        found on a replica may have been created a moment ago)."""
        replicas = self.replicas
        replica = replicas.pick(index) if replicas is not None else None
        if replica is not None:
            try:
                with replica.engine.connect() as conn:
                    result = read(conn)
                if confirm is None or confirm(result):
                    return result
            except sa.exc.OperationalError:
                replicas.failed(replica)  # type: ignore[union-attr]
        with self.engines[index].connect() as conn:
            return read(conn)

    def routing(self) -> Routing:
        """The shard map as this process follows it."""
        routing = self._routing
        if routing is not None and time.monotonic() < self._checked_at + self.map_refresh_s:
            return routing
        if routing is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return routing  # another thread is asking the home right now: nobody waits for it
        try:
            if self._routing is None:
                self._routing = self._load(None)
            elif time.monotonic() >= self._checked_at + self.map_refresh_s:
                try:
                    self._routing = self._load(self._routing)
                except (sa.exc.SQLAlchemyError, ShardMapError) as exc:
                    # Keep following the map we have; a home that is away shows in /healthz.
                    log.warning("shard map not refreshed: %s", exc)
            self._checked_at = time.monotonic()
            return self._routing
        finally:
            self._lock.release()

    def reload_map(self) -> Routing:
        """Read the map now (a move's own steps, a fenced write waiting for the switch)."""
        with self._lock:
            self._routing = self._load(self._routing, force=True)
            self._checked_at = time.monotonic()
            return self._routing

    def check(self) -> Routing:
        """Start-up: the map read and checked against PUNCTUAL_DATABASE_URLS, and every
        replica that answers recognised as a replica of one of them, or ShardMapError."""
        routing = self.routing()
        if self.replicas is not None:
            self.replicas.check()
        return routing

    def _load(self, current: Routing | None, force: bool = False) -> Routing:
        if current is None:
            identities = [self._identity(engine) for engine in self.engines]
            home = find_home(identities)
        else:
            identities, home = list(current.identities), current.home_index
        with self.engines[home].connect() as conn:
            if current is not None and not force and read_version(conn) == current.map.version:
                return current
            value = read_map(conn)
        if value is None:
            raise ShardMapError("the home database holds no shard map yet: run `punctual migrate`")
        return route(identities, value, self.settings.shards)

    @staticmethod
    def _identity(engine: Engine):
        try:
            return read_identity(engine)
        except sa.exc.OperationalError:  # down for now: its shards show as down in /healthz
            return UNREACHABLE

    def database_index(self, shard: int) -> int:
        """Which DSN (index into PUNCTUAL_DATABASE_URLS) serves logical shard `shard`."""
        return self.routing().shard_index[shard]

    def engine_for_shard(self, shard: int) -> Engine:
        return self.engines[self.database_index(shard)]

    @property
    def home(self) -> Engine:
        """The home database: owners, API keys, named limits and the shard map live there."""
        return self.engines[self.routing().home_index]

    def shard_fenced(self, shard: int) -> bool:
        """A move has fenced the shard: its pollers do not claim."""
        return self.routing().fenced(shard)

    def foreign_shards(self, index: int) -> list[int]:
        """Shards whose rows DSN `index` holds without serving them (see Routing)."""
        return self.routing().foreign_shards(index)

    def for_each_database(
        self,
        items: Sequence[T],
        shard_of: Callable[[T], int],
        write: Callable[[Engine, list[T]], R],
        fence_wait_s: float = FENCE_WAIT_S,
    ) -> list[R]:
        """`write(engine, group)` for the items of each database, grouped by the map.

        A group refused by a move's fence waits for the map to switch (at most
        `fence_wait_s`, then the refusal is raised) and is written again where its
        shard went: a worker's start, hold, heartbeat or completion during a move is
        forwarded, not lost. A refused write changed nothing (its transaction rolled
        back), so nothing is written on both databases. Groups already written stay
        written.
        """
        results: list[R] = []
        pending = list(items)
        deadline = None
        while pending:
            groups: dict[int, list[T]] = defaultdict(list)
            routing = self.routing()
            for item in pending:
                groups[routing.shard_index[shard_of(item)]].append(item)
            pending = []
            refused: sa.exc.DBAPIError | None = None
            for index, group in groups.items():
                try:
                    results.append(write(self.engines[index], group))
                except sa.exc.DBAPIError as exc:
                    if not is_fence_error(exc):
                        raise
                    pending.extend(group)
                    refused = exc
            if pending:
                deadline = deadline or time.monotonic() + fence_wait_s
                if time.monotonic() > deadline and refused is not None:
                    raise refused
                time.sleep(0.2)
                try:
                    self.reload_map()
                except sa.exc.SQLAlchemyError:
                    pass  # the home is away for a moment: try again after the pause
        return results

    @property
    def is_sqlite(self) -> bool:
        return self.settings.embedded

    def dispose(self) -> None:
        if self.__dict__.get("replicas") is not None:
            self.__dict__.pop("replicas").dispose()
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
