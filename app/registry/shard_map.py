"""The shard map: which database holds each logical shard, kept as data in the registry.

Every database carries its identity (a `punctual_database` row: the cluster it
belongs to, its own id, the home's id, its position when it was first migrated).
The home database (owners, API keys, named limits) also holds the map: one
`shard_map` row per logical shard naming the database that serves it, and a
`punctual_cluster` row whose `map_version` goes up with every change. The first
`punctual migrate` writes the map (shard s on DSN s mod N, as before) and no later
migrate rewrites it; only a shard move changes it (app.registry.mover).

Databases are recognised by identity, not by their place in PUNCTUAL_DATABASE_URLS:
a reordered list is served correctly. A list that lacks a database holding shards
or the home, lists one database twice, lists a database of another cluster or one
never migrated is refused with one line (`ShardMapError`). A database added at the
end holds nothing until a move gives it shards.

`route` is pure: identities and a map in, a Routing (shard -> DSN index) out.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from app.registry.dialect import is_postgres
from app.registry.schema import cluster_databases, punctual_cluster, punctual_database, shard_map

# A move's steps are MOVE_STEPS, in order (app.registry.mover). While a shard is
# `fenced` its pollers do not claim and its rows refuse writes where it was.
FENCED_STEPS = ("fenced",)


class ShardMapError(Exception):
    """The DSN list and the stored map disagree: one line, naming the database."""


class MapUnavailable(ShardMapError):
    """The map cannot be read now (the home does not answer): not a refusal; a
    process starts and reads it when the home is back."""


@dataclass(frozen=True)
class Identity:
    database_id: uuid.UUID
    cluster_id: uuid.UUID
    home_id: uuid.UUID
    created_index: int


@dataclass(frozen=True)
class Placement:
    database_id: uuid.UUID  # the database serving the shard
    move_peer: uuid.UUID | None = None  # during a move: the target (before the switch) or the source (after)
    move_step: str | None = None


@dataclass(frozen=True)
class ShardMap:
    cluster_id: uuid.UUID
    home_id: uuid.UUID
    version: int
    placements: tuple[Placement, ...]  # index = logical shard
    created_index: dict | None = None  # database_id -> its place in the list when stamped (cluster_databases)

    @property
    def shards(self) -> int:
        return len(self.placements)

    def shards_on(self, database_id: uuid.UUID) -> list[int]:
        return [s for s, p in enumerate(self.placements) if p.database_id == database_id]


@dataclass(frozen=True)
class Routing:
    """A map resolved against this process's PUNCTUAL_DATABASE_URLS."""

    map: ShardMap
    identities: tuple[Identity, ...]  # index = DSN index
    shard_index: tuple[int, ...]  # logical shard -> DSN index
    home_index: int

    def index_of_database(self, database_id: uuid.UUID) -> int | None:
        for index, identity in enumerate(self.identities):
            if identity.database_id == database_id:
                return index
        return None

    def index_of(self, database_id: uuid.UUID) -> int:
        """The DSN index of a database the map names (route() made sure it is listed)."""
        index = self.index_of_database(database_id)
        if index is None:
            raise ShardMapError(f"database {short(database_id)} is not in PUNCTUAL_DATABASE_URLS")
        return index

    def shards_of(self, index: int) -> list[int]:
        return [s for s, i in enumerate(self.shard_index) if i == index]

    def fenced(self, shard: int) -> bool:
        return self.map.placements[shard].move_step in FENCED_STEPS

    def foreign_shards(self, index: int) -> list[int]:
        """Shards whose rows this DSN holds without serving them: a move's copy on its
        target before the switch, the rows left on its source after it. Reads that
        scan every DSN leave them out, so a moving job is never listed twice."""
        database_id = self.identities[index].database_id
        return [s for s, p in enumerate(self.map.placements) if p.move_peer == database_id]


def short(database_id: uuid.UUID) -> str:
    return database_id.hex[:8] + "…"


def _shard_list(shards: Sequence[int]) -> str:
    return ",".join(str(s) for s in shards) if shards else "none"


class Unreachable:
    """Stands for the identity of a DSN that did not answer when the map was read."""

    def __repr__(self) -> str:
        return "UNREACHABLE"


UNREACHABLE = Unreachable()


def find_home(identities: Sequence[Identity | None | Unreachable]) -> int:
    """The DSN index of the home database, or ShardMapError. Unreachable DSNs are
    left out; the home must answer (the map is there)."""
    for index, identity in enumerate(identities):
        if identity is None:
            raise ShardMapError(
                f"PUNCTUAL_DATABASE_URLS[{index}] is not a migrated Punctual database: run `punctual migrate`"
            )
    answered = [(i, x) for i, x in enumerate(identities) if isinstance(x, Identity)]
    if not answered:
        raise MapUnavailable("no database in PUNCTUAL_DATABASE_URLS answers")
    first_index, first = answered[0]
    for index, identity in answered:
        if identity.cluster_id != first.cluster_id:
            raise ShardMapError(
                f"PUNCTUAL_DATABASE_URLS[{index}] is database {short(identity.database_id)} of cluster "
                f"{short(identity.cluster_id)}, but PUNCTUAL_DATABASE_URLS[{first_index}] belongs to cluster "
                f"{short(first.cluster_id)}: one list must name one cluster's databases"
            )
    seen: dict[uuid.UUID, int] = {}
    for index, identity in answered:
        if identity.database_id in seen:
            raise ShardMapError(
                f"PUNCTUAL_DATABASE_URLS[{seen[identity.database_id]}] and [{index}] are the same database "
                f"{short(identity.database_id)}: list each database once"
            )
        seen[identity.database_id] = index
    home = seen.get(first.home_id)
    if home is None:
        listed = ", ".join(short(i.database_id) for _index, i in answered)
        unanswered = [str(i) for i, x in enumerate(identities) if x is UNREACHABLE]
        if unanswered:
            raise MapUnavailable(
                f"the home database {short(first.home_id)} (owners, API keys, the shard map) does not answer "
                f"(PUNCTUAL_DATABASE_URLS[{','.join(unanswered)}] unreachable)"
            )
        raise ShardMapError(
            f"the home database {short(first.home_id)} (owners, API keys, the shard map) is not in "
            f"PUNCTUAL_DATABASE_URLS (it lists {listed}): add its DSN back"
        )
    return home


def stand_ins(identities: Sequence[Identity | None | Unreachable], value: ShardMap) -> list[Identity | None]:
    """Identities with each unreachable DSN taken for the cluster's database that was
    stamped at its place in the list and that no answering DSN is (None if none is):
    its shards are then reported down, not refused, until it answers."""
    home = next(x for x in identities if isinstance(x, Identity))
    answered = {x.database_id for x in identities if isinstance(x, Identity)}
    filled: list[Identity | None] = []
    for index, identity in enumerate(identities):
        if not isinstance(identity, Unreachable):
            filled.append(identity)
            continue
        guess = [d for d, i in (value.created_index or {}).items() if i == index and d not in answered]
        filled.append(Identity(guess[0], home.cluster_id, home.home_id, index) if len(guess) == 1 else None)
    return filled


def route(
    identities: Sequence[Identity | None | Unreachable], shard_map_value: ShardMap, shards: int
) -> Routing:
    """Resolve the stored map against the DSN list, or refuse with one line."""
    home = find_home(identities)
    if any(x is UNREACHABLE for x in identities):
        identities = stand_ins(identities, shard_map_value)
        find_home(identities)  # an unreachable DSN no database stands for: "not migrated"
    known = tuple(x for x in identities if isinstance(x, Identity))  # find_home refused any other
    if shard_map_value.shards != shards:
        raise ShardMapError(
            f"PUNCTUAL_SHARDS={shards}, but the registry's shard map (written by the first "
            f"`punctual migrate`) has {shard_map_value.shards} shards: "
            f"set PUNCTUAL_SHARDS={shard_map_value.shards}"
        )
    by_id = {identity.database_id: index for index, identity in enumerate(known)}
    missing: dict[uuid.UUID, list[int]] = {}
    for shard, placement in enumerate(shard_map_value.placements):
        for database_id in (placement.database_id, placement.move_peer):
            if database_id is not None and database_id not in by_id:
                missing.setdefault(database_id, []).append(shard)
    if missing:
        database_id, held = next(iter(missing.items()))
        listed = ", ".join(f"[{i}] {short(x.database_id)}" for i, x in enumerate(known))
        raise ShardMapError(
            f"the shard map puts shards {_shard_list(held)} on database {short(database_id)}, "
            f"which is not in PUNCTUAL_DATABASE_URLS (it lists {listed}): add that database's DSN back"
        )
    shard_index = tuple(by_id[p.database_id] for p in shard_map_value.placements)
    return Routing(shard_map_value, known, shard_index, home)


def initial_map(cluster_id: uuid.UUID, database_ids: Sequence[uuid.UUID], shards: int) -> ShardMap:
    """The map of a new cluster: shard s on the s mod N-th database, the first one home."""
    placements = tuple(Placement(database_ids[s % len(database_ids)]) for s in range(shards))
    return ShardMap(cluster_id, database_ids[0], 1, placements)


# --- reading and writing -------------------------------------------------------------


def read_identity(engine: sa.Engine) -> Identity | None:
    """This database's identity; None when it was never migrated to the shard map."""
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.select(punctual_database)).mappings().first()
    except (sa.exc.ProgrammingError, sa.exc.OperationalError) as exc:
        if _missing_table(exc):
            return None
        raise
    if row is None:
        return None
    return Identity(row["database_id"], row["cluster_id"], row["home_id"], row["created_index"])


def _missing_table(exc: sa.exc.DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return "punctual_database" in text and ("does not exist" in text or "no such table" in text)


def read_version(conn: sa.Connection) -> int | None:
    return conn.execute(sa.select(punctual_cluster.c.map_version)).scalar()


def read_map(conn: sa.Connection) -> ShardMap | None:
    cluster = conn.execute(sa.select(punctual_cluster)).mappings().first()
    if cluster is None:
        return None
    rows = conn.execute(sa.select(shard_map).order_by(shard_map.c.shard)).mappings().all()
    placements = tuple(Placement(r["database_id"], r["move_peer"], r["move_step"]) for r in rows)
    if [r["shard"] for r in rows] != list(range(len(rows))):
        raise ShardMapError("the shard map on the home database is damaged: its shards are not 0..N-1")
    places = sa.select(cluster_databases.c.database_id, cluster_databases.c.created_index)
    created = dict(conn.execute(places).all())
    return ShardMap(cluster["cluster_id"], cluster["home_id"], cluster["map_version"], placements, created)


def write_identity(conn: sa.Connection, identity: Identity, now: datetime) -> None:
    conn.execute(punctual_database.delete())
    conn.execute(
        punctual_database.insert().values(
            database_id=identity.database_id,
            cluster_id=identity.cluster_id,
            home_id=identity.home_id,
            created_index=identity.created_index,
            created_at=now,
        )
    )


def write_new_map(conn: sa.Connection, value: ShardMap, now: datetime) -> None:
    conn.execute(
        punctual_cluster.insert().values(
            cluster_id=value.cluster_id,
            home_id=value.home_id,
            map_version=value.version,
            created_at=now,
        )
    )
    conn.execute(
        shard_map.insert(),
        [
            {
                "shard": s,
                "database_id": p.database_id,
                "move_peer": None,
                "move_step": None,
                "updated_at": now,
            }
            for s, p in enumerate(value.placements)
        ],
    )


def record_databases(conn: sa.Connection, identities: Sequence[Identity], now: datetime) -> None:
    """On the home: every database of the cluster and its place when stamped (idempotent)."""
    known = set(conn.execute(sa.select(cluster_databases.c.database_id)).scalars())
    fresh = [
        {"database_id": i.database_id, "created_index": i.created_index, "created_at": now}
        for i in identities
        if i.database_id not in known
    ]
    if fresh:
        conn.execute(cluster_databases.insert(), fresh)


def set_placement(conn: sa.Connection, shard: int, placement: Placement, now: datetime) -> None:
    """Change one shard's row and bump the map's version (in the caller's transaction)."""
    conn.execute(
        shard_map.update()
        .where(shard_map.c.shard == shard)
        .values(
            database_id=placement.database_id,
            move_peer=placement.move_peer,
            move_step=placement.move_step,
            updated_at=now,
        )
    )
    conn.execute(punctual_cluster.update().values(map_version=punctual_cluster.c.map_version + 1))


def establish(engines: Sequence[sa.Engine], shards: int, now: datetime | None = None) -> list[str]:
    """`punctual migrate`'s second half: give each database its identity and, on the
    first run, write the map. Returns one line per thing done.

    A brand-new cluster gets identities written to every database first (DSN 0,
    the home, first of all), then the map on the home in one transaction, so an
    interrupted first migrate is finished by the next one. Once the map exists it
    is never rewritten here; a DSN without an identity is a new, empty database.
    """
    now = now or datetime.now(UTC)
    with _migrate_lock(engines[0]):
        return _establish(engines, shards, now)


@contextlib.contextmanager
def _migrate_lock(engine: sa.Engine):
    """Two `punctual migrate` at once (compose restarts, two operators) take turns, or
    both would stamp the same new database with a different identity."""
    if not is_postgres(engine):
        yield
        return
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(7710226)"))
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(7710226)"))
            conn.commit()


def _establish(engines: Sequence[sa.Engine], shards: int, now: datetime) -> list[str]:
    identities = [read_identity(engine) for engine in engines]
    done: list[str] = []
    known = [i for i in identities if i is not None]
    if known:
        cluster_id, home_id = known[0].cluster_id, known[0].home_id
    else:
        cluster_id, home_id = uuid.uuid4(), uuid.uuid4()
    home_index = next(
        (i for i, x in enumerate(identities) if x is not None and x.database_id == home_id), None
    )
    if home_index is None and identities[0] is None:
        home_index = 0
    if home_index is None:
        raise ShardMapError(
            f"the home database {short(home_id)} (owners, API keys, the shard map) is not in "
            f"PUNCTUAL_DATABASE_URLS: add its DSN back before migrating"
        )
    home_map = _read_map_of(engines[home_index]) if identities[home_index] is not None else None
    for index, engine in enumerate(engines):
        if identities[index] is not None:
            continue
        database_id = home_id if index == home_index else uuid.uuid4()
        identity = Identity(database_id, cluster_id, home_id, index)
        with engine.begin() as conn:
            write_identity(conn, identity, now)
        identities[index] = identity
        done.append(
            f"PUNCTUAL_DATABASE_URLS[{index}] is database {short(database_id)}"
            + (
                " (home)"
                if index == home_index
                else (" (new: holds no shard until a move)" if home_map is not None else "")
            )
        )
    if home_map is None:
        ids = [identity.database_id for identity in identities if identity is not None]
        # The home first: shard 0 stays where owners and keys are, as before the map.
        ordered = [ids[home_index]] + [x for i, x in enumerate(ids) if i != home_index]
        value = initial_map(cluster_id, ordered, shards)
        with engines[home_index].begin() as conn:
            if read_map(conn) is None:
                write_new_map(conn, value, now)
                done.append(
                    f"shard map written: {shards} shards over {len(ids)} databases "
                    f"(shard s on PUNCTUAL_DATABASE_URLS[s mod {len(ids)}])"
                )
    stamped = [identity for identity in identities if identity is not None]  # every one, by now
    with engines[home_index].begin() as conn:
        record_databases(conn, stamped, now)
    written = _read_map_of(engines[home_index])
    if written is None:
        raise ShardMapError(
            "the home database holds no shard map after migrating: run `punctual migrate` again"
        )
    route(stamped, written, shards)  # the same check every process makes
    return done


def _read_map_of(engine: sa.Engine) -> ShardMap | None:
    with engine.connect() as conn:
        return read_map(conn)
