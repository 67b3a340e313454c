"""Read replicas: streaming replicas of the primaries, for reads that may be a little stale.

PUNCTUAL_REPLICA_URLS lists replicas in any order, any number per primary. A replica
is recognised by the identity it carries (the `punctual_database` row streamed from
its primary) and must be in recovery (`pg_is_in_recovery()`) with its primary's
system identifier; one that answers and is not a replica of a listed primary is
refused with one line (`ReplicaError`, at start-up) and never read.

A replica is read only while it is fresh: its state is probed at most every
CHECK_S per process (the primary's WAL position, then the replica's replay position
and last replayed commit), and one more than PUNCTUAL_REPLICA_MAX_LAG_S behind, or
not answering, is skipped: the read goes to its primary, and
`punctual_replica_skipped_reads_total{reason}` counts it. Staleness is bounded from
above without trusting an idle primary's old commit time: a replica that replayed
everything the primary had written at the last probe is caught up; otherwise it is
as stale as the older of its last replayed commit and the newest earlier probe of
the primary whose position it has passed (`staleness`, pure).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from app.metrics import REPLICA_SKIPPED_READS
from app.registry.shard_map import Identity, Routing, ShardMapError, read_identity, short

# How long one probe's verdict on a replica is used before it is probed again.
CHECK_S = 1.0
# Probes of each primary's WAL position kept to bound a replica's staleness.
SAMPLES = 32
# A replica that does not accept a connection within this is taken for down.
CONNECT_TIMEOUT_S = 2

log = logging.getLogger("punctual.replicas")


class ReplicaError(ShardMapError):
    """A listed replica is not a replica of a listed primary: one line, naming it."""


def one_line(exc: BaseException) -> str:
    """An error's class and first line, without a DSN or a password."""
    cause = getattr(exc, "orig", None) or exc
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


def parse_lsn(text: str) -> int:
    """A pg_lsn ('16/B374D848') as a number."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def staleness(
    primary_lsn: int,
    replay_lsn: int | None,
    replay_age_s: float | None,
    samples: Sequence[tuple[float, int]],
    now: float,
) -> float:
    """Seconds a replica may be behind its primary, from above: 0 when it has replayed
    the primary's position read just before (`primary_lsn`); else the smaller of the
    age of its last replayed commit and the age of the newest earlier sample (time,
    position) of the primary that it has replayed. Infinite when neither is known."""
    if replay_lsn is None:
        return float("inf")
    if replay_lsn >= primary_lsn:
        return 0.0
    bounds = [] if replay_age_s is None else [max(0.0, replay_age_s)]
    passed = [at for at, lsn in samples if lsn <= replay_lsn]
    if passed:
        bounds.append(max(0.0, now - max(passed)))
    return min(bounds) if bounds else float("inf")


def recognise(
    url_index: int,
    identity: Identity | None,
    in_recovery: bool,
    system_id: int,
    routing: Routing,
    primary_system_ids: Callable[[int], int | None],
) -> int:
    """The DSN index of the primary this replica copies, or ReplicaError (one line)."""
    name = f"PUNCTUAL_REPLICA_URLS[{url_index}]"
    if identity is None:
        raise ReplicaError(f"{name} is not a Punctual database (no identity): list replicas of the primaries")
    if identity.cluster_id != routing.map.cluster_id:
        raise ReplicaError(
            f"{name} is database {short(identity.database_id)} of cluster {short(identity.cluster_id)}, "
            f"not of PUNCTUAL_DATABASE_URLS' cluster {short(routing.map.cluster_id)}: "
            "list replicas of the primaries"
        )
    index = routing.index_of_database(identity.database_id)
    if index is None:
        raise ReplicaError(
            f"{name} copies database {short(identity.database_id)}, which is not in "
            "PUNCTUAL_DATABASE_URLS: list replicas of the primaries"
        )
    if not in_recovery:
        raise ReplicaError(
            f"{name} is not in recovery (pg_is_in_recovery() is false): it is a primary or a copy "
            f"of PUNCTUAL_DATABASE_URLS[{index}], not a streaming replica"
        )
    expected = primary_system_ids(index)
    if expected is not None and expected != system_id:
        raise ReplicaError(
            f"{name} carries the identity of PUNCTUAL_DATABASE_URLS[{index}] but belongs to another "
            "PostgreSQL cluster (system identifier differs): not its replica"
        )
    return index


@dataclass
class Replica:
    url_index: int
    engine: Engine
    primary: int | None = None  # the DSN index it copies, once recognised
    refused: str | None = None  # why it is never read
    fresh: bool = False
    reason: str = "down"  # why it is skipped while not fresh: down, lag, refused
    checked_at: float = float("-inf")
    lag_s: float = float("inf")
    lock: threading.Lock = field(default_factory=threading.Lock)


class Replicas:
    """The replicas of one Registry: which is fresh, probed at most every CHECK_S."""

    def __init__(
        self,
        urls: Sequence[str],
        max_lag_s: float,
        primaries: Callable[[], Sequence[Engine]],
        routing: Callable[[], Routing],
        create_engine: Callable[[str], Engine],
    ):
        self.max_lag_s = max_lag_s
        self.check_s = CHECK_S
        self._primaries = primaries
        self._routing = routing
        self.replicas = tuple(Replica(i, create_engine(url)) for i, url in enumerate(urls))
        self._samples: dict[int, deque[tuple[float, int]]] = {}
        self._system_ids: dict[int, int] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def check(self) -> None:
        """Start-up: every replica that answers is recognised, or ReplicaError. One
        that does not answer is recognised when it does (and, if it is not a replica
        of a listed primary then, logged and never read)."""
        for replica in self.replicas:
            self._probe(replica, raise_refusal=True)

    def pick(self, index: int) -> Replica | None:
        """A fresh replica of DSN `index` (round robin among them), or None; a None
        with replicas of `index` listed counts as a skipped read."""
        candidates = [r for r in self.replicas if r.primary == index or r.primary is None]
        mine = []
        for replica in candidates:
            if replica.refused is None:
                self._maybe_probe(replica)
            if replica.primary == index:
                mine.append(replica)
        fresh = [r for r in mine if r.fresh]
        if fresh:
            return fresh[next(self._turn) % len(fresh)]
        # One never recognised (down since start) may be a replica of `index`: counted as down.
        unknown = [r for r in candidates if r.primary is None and r.refused is None]
        if mine or unknown:
            REPLICA_SKIPPED_READS.labels(reason=mine[0].reason if mine else "down").inc()
        return None

    def failed(self, replica: Replica) -> None:
        """A read on `replica` failed (it went away, or a recovery conflict cancelled
        the read): skipped until its next probe."""
        replica.fresh, replica.reason, replica.checked_at = False, "down", time.monotonic()
        REPLICA_SKIPPED_READS.labels(reason="down").inc()

    def _maybe_probe(self, replica: Replica) -> None:
        if time.monotonic() < replica.checked_at + self.check_s:
            return
        if not replica.lock.acquire(blocking=False):
            return  # another thread is probing it: this read uses the last verdict
        try:
            if time.monotonic() >= replica.checked_at + self.check_s:
                self._probe(replica, raise_refusal=False)
        finally:
            replica.lock.release()

    def _probe(self, replica: Replica, raise_refusal: bool) -> None:
        try:
            self._probe_once(replica)
        except ReplicaError as exc:
            replica.refused, replica.fresh, replica.reason = str(exc), False, "refused"
            if raise_refusal:
                raise
            log.error("replica not used: %s", exc)
        except (sa.exc.SQLAlchemyError, ShardMapError, OSError) as exc:
            if replica.fresh or replica.checked_at == float("-inf"):
                log.warning("PUNCTUAL_REPLICA_URLS[%d] skipped: %s", replica.url_index, one_line(exc))
            replica.fresh, replica.reason = False, "down"
        finally:
            replica.checked_at = time.monotonic()

    def _probe_once(self, replica: Replica) -> None:
        routing = self._routing()
        if replica.primary is None or replica.reason == "down":
            identity = read_identity(replica.engine)
            with replica.engine.connect() as conn:
                in_recovery, system_id = conn.exec_driver_sql(
                    "SELECT pg_is_in_recovery(), (SELECT system_identifier FROM pg_control_system())"
                ).one()
            replica.primary = recognise(
                replica.url_index, identity, in_recovery, system_id, routing, self._system_id
            )
        index = replica.primary
        with self._primaries()[index].connect() as conn:
            primary_lsn = parse_lsn(conn.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one())
        sampled_at = time.monotonic()
        with replica.engine.connect() as conn:
            in_recovery, replay, age = conn.exec_driver_sql(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, "
                "EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8"
            ).one()
        if not in_recovery:
            raise ReplicaError(
                f"PUNCTUAL_REPLICA_URLS[{replica.url_index}] left recovery (promoted): "
                f"no longer a replica of PUNCTUAL_DATABASE_URLS[{index}]"
            )
        with self._lock:
            samples = self._samples.setdefault(index, deque(maxlen=SAMPLES))
            earlier = list(samples)
            samples.append((sampled_at, primary_lsn))
        replica.lag_s = staleness(
            primary_lsn, parse_lsn(replay) if replay else None, age, earlier, time.monotonic()
        )
        replica.fresh = replica.lag_s <= self.max_lag_s
        replica.reason = "lag" if not replica.fresh else ""

    def _system_id(self, index: int) -> int | None:
        if index not in self._system_ids:
            with self._primaries()[index].connect() as conn:
                self._system_ids[index] = conn.exec_driver_sql(
                    "SELECT system_identifier FROM pg_control_system()"
                ).scalar_one()
        return self._system_ids[index]

    def dispose(self) -> None:
        for replica in self.replicas:
            replica.engine.dispose()
