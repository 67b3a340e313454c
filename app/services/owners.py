"""Owners, their API keys, signing secrets, weights and the owner switch.

An owner's weight (app.core.weights, default 1) is its share of each claim batch
relative to the other owners with due rows; `punctual owners set OWNER --weight N`.
While an owner is paused (`punctual owners pause`, `pause_owner`) none of its runs
starts: the pollers read the paused owners with the weights (`claim_view`, cached).

Owners and keys live on the home database (app.registry.shard_map). Only the SHA-256 of a key
is stored; a request's key is hashed and looked up, then compared in constant time.
A key's id is the first KEY_ID_CHARS hex digits of that hash: enough to name it in
`punctual keys list|revoke`, never enough to use it.

Lookups are cached briefly per process because every request and every signed call
needs one. The caches bound how long a change takes to reach every process: a
revoked key is refused within KEY_CACHE_TTL_S, a rotated secret signs within
SECRET_CACHE_TTL_S. The keys' cache is bounded too (KEY_CACHE_MAX known keys and as
many unknown ones, the least recently looked up leaving first), since anyone can
send a key: a flood of made-up keys neither grows the process nor pushes the known
keys out.

Rotation (`rotate_secret`): the owner gets a new signing secret and keeps the old
one as `previous_signing_secret` until `previous_secret_until`; meanwhile calls are
signed with both (`signing_secrets`), so a receiver verifies them whichever of the
two it holds, and can switch at any time in the window.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from app.core.timefmt import format_instant, utcnow
from app.core.weights import DEFAULT_WEIGHT, MAX_WEIGHT, MIN_WEIGHT
from app.registry.bulk import key_in
from app.registry.engines import Registry
from app.registry.schema import api_keys, claimed_without_row, jobs, owners, runs
from app.services.errors import NotFound
from app.services.jobs import renew_held_runs, take_back_owner

KEY_PREFIX = "pk_"
SECRET_PREFIX = "whsec_"
KEY_ID_CHARS = 12
KEY_CACHE_TTL_S = 2.0
KEY_CACHE_MAX = 10_000
SECRET_CACHE_TTL_S = 5.0


@dataclass(frozen=True)
class NewKey:
    owner: str
    api_key: str
    signing_secret: str

    @property
    def key_id(self) -> str:
        return key_id_of(hash_key(self.api_key))

    def as_dict(self) -> dict:
        return {
            "owner": self.owner,
            "key_id": self.key_id,
            "api_key": self.api_key,
            "signing_secret": self.signing_secret,
        }


@dataclass(frozen=True)
class KeyInfo:
    """What `keys list` shows of a key: never the key, nor its whole hash."""

    key_id: str
    owner: str
    created_at: datetime
    revoked_at: datetime | None

    def as_dict(self) -> dict:
        return {
            "key_id": self.key_id,
            "owner": self.owner,
            "created_at": format_instant(self.created_at),
            "revoked_at": None if self.revoked_at is None else format_instant(self.revoked_at),
        }


@dataclass(frozen=True)
class Rotation:
    owner: str
    signing_secret: str
    previous_secret_until: datetime

    def as_dict(self) -> dict:
        return {
            "owner": self.owner,
            "signing_secret": self.signing_secret,
            "previous_secret_until": format_instant(self.previous_secret_until),
        }


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def key_id_of(key_hash: str) -> str:
    return key_hash[:KEY_ID_CHARS]


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create_key(registry: Registry, owner: str) -> NewKey:
    """A new API key for `owner`, creating the owner (and its signing secret) on first use."""
    owner = owner.strip()
    if not owner or len(owner) > 200:
        raise ValueError("owner must be 1-200 characters")
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    with registry.home.begin() as conn:
        secret = conn.execute(sa.select(owners.c.signing_secret).where(owners.c.owner == owner)).scalar()
        if secret is None:
            secret = _new_secret()
            conn.execute(owners.insert().values(owner=owner, signing_secret=secret, created_at=now))
        conn.execute(api_keys.insert().values(key_hash=hash_key(api_key), owner=owner, created_at=now))
    return NewKey(owner, api_key, secret)


def list_keys(registry: Registry, owner: str | None = None) -> list[KeyInfo]:
    """Every key (or one owner's), oldest first, revoked ones included."""
    query = sa.select(api_keys).order_by(api_keys.c.created_at, api_keys.c.key_hash)
    if owner is not None:
        query = query.where(api_keys.c.owner == owner)
    with registry.home.connect() as conn:
        return [_info(row) for row in conn.execute(query).mappings()]


@dataclass(frozen=True)
class OwnerActivity:
    """An owner as `punctual owners` shows it: its weight, whether it is paused, and
    what it has on the way right now, counted in the registry (every DSN)."""

    owner: str
    weight: int
    due: int  # scheduled jobs whose next_run_at has come, not claimed yet
    waiting: int  # runs claimed, not started (in a dispatch message, or waiting in a worker)
    running: int  # runs started, their call in flight
    paused: bool = False

    def as_dict(self) -> dict:
        return {
            "owner": self.owner,
            "weight": self.weight,
            "paused": self.paused,
            "due": self.due,
            "waiting": self.waiting,
            "running": self.running,
        }


def set_weight(registry: Registry, owner: str, weight: int) -> None:
    """Store `owner`'s weight; the pollers see it within CACHE_TTL_S."""
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be an integer from {MIN_WEIGHT} to {MAX_WEIGHT}")
    with registry.home.begin() as conn:
        update = sa.update(owners).where(owners.c.owner == owner).values(weight=weight)
        changed = conn.execute(update).rowcount
    if not changed:
        raise LookupError(f"no owner {owner!r} (owners are made by `punctual keys create --owner`)")


def weights(registry: Registry) -> dict[str, int]:
    """The owners whose weight is not the default (the rest weigh DEFAULT_WEIGHT)."""
    return claim_view(registry).weights


@dataclass(frozen=True)
class ClaimView:
    """What the pollers need to know of the owners, read in one query: the weights
    that are not the default, and the paused owners."""

    weights: dict[str, int]
    paused: frozenset[str]


def claim_view(registry: Registry) -> ClaimView:
    with registry.home.connect() as conn:
        query = sa.select(owners.c.owner, owners.c.weight, owners.c.paused_at).where(
            sa.or_(owners.c.weight != DEFAULT_WEIGHT, owners.c.paused_at.isnot(None))
        )
        rows = conn.execute(query).all()
    return ClaimView(
        {row.owner: row.weight for row in rows if row.weight != DEFAULT_WEIGHT},
        frozenset(row.owner for row in rows if row.paused_at is not None),
    )


# How long after `punctual owners pause` marks the owner every poller knows: the
# directory's cache (KEY_CACHE_TTL_S), and a claim or sweep that read it just before.
PAUSE_SETTLE_S = KEY_CACHE_TTL_S + 1.0


@dataclass(frozen=True)
class Paused:
    owner: str
    taken_back: int  # schedule runs claimed and not started: their jobs are due again
    held: int  # off-schedule runs not started: they wait in the outbox until the resume

    def as_dict(self) -> dict:
        return {"owner": self.owner, "taken_back": self.taken_back, "held": self.held}


def pause_owner(registry: Registry, owner: str, settle_s: float = PAUSE_SETTLE_S) -> Paused:
    """Pause `owner`: none of its runs starts until `resume_owner`; runs in flight finish.

    The mark comes first; after `settle_s` every poller reads it (claims skip the
    owner's due rows, sweeps its unpublished runs), and what was claimed meanwhile is
    taken back on every database, each in one transaction: a schedule run claimed
    and not started is deleted and its job's lease cleared (the job is due again as
    it was, as a pause of the job does it), and a run leased on its own row (an
    off-schedule run, an `allow` job's occurrence) not started gets a new lease token,
    so its dispatch message starts nothing, and goes back to the outbox unpublished
    (the janitor does not take back a paused owner's waiting runs). LookupError
    for an unknown owner. Pausing a paused owner takes back again and changes nothing else.
    """
    with registry.home.begin() as conn:
        marked = conn.execute(
            owners.update()
            .where(owners.c.owner == owner)
            .values(paused_at=sa.func.coalesce(owners.c.paused_at, utcnow()))
            .returning(owners.c.owner)
        ).first()
    if marked is None:
        raise LookupError(f"no owner {owner!r} (owners are made by `punctual keys create --owner`)")
    time.sleep(settle_s)
    taken_back = held = 0
    for index in range(len(registry.engines)):
        done = take_back_owner(registry, index, owner, utcnow())
        taken_back += done[0]
        held += done[1]
    return Paused(owner, taken_back, held)


def resume_owner(registry: Registry, owner: str) -> int:
    """Resume `owner`: its due jobs are claimed again (each job's misfire policy
    applies to what it missed) and its held runs get a fresh lease, the relay sweep
    publishing them within a poll interval of the pollers reading the change. Returns
    how many held runs were renewed; LookupError for an unknown owner."""
    with registry.home.begin() as conn:
        found = conn.execute(
            owners.update().where(owners.c.owner == owner).values(paused_at=None).returning(owners.c.owner)
        ).first()
    if found is None:
        raise LookupError(f"no owner {owner!r} (owners are made by `punctual keys create --owner`)")
    return sum(renew_held_runs(registry, index, owner, utcnow()) for index in range(len(registry.engines)))


def activity(registry: Registry) -> list[OwnerActivity]:
    """Every owner with its weight, its switch and its due, waiting and running counts, by name."""
    now = utcnow()
    with registry.home.connect() as conn:
        query = sa.select(owners.c.owner, owners.c.weight, owners.c.paused_at)
        rows = conn.execute(query).all()
    weight_of = {row.owner: row.weight for row in rows}
    paused = {row.owner for row in rows if row.paused_at is not None}
    counts: dict[str, list[int]] = {owner: [0, 0, 0] for owner in weight_of}
    due = (
        sa.select(jobs.c.owner, sa.func.count())
        .where(jobs.c.state == "scheduled", jobs.c.next_run_at <= now)
        .group_by(jobs.c.owner)
    )
    active = (
        sa.select(runs.c.owner, runs.c.state, sa.func.count())
        .where(runs.c.state.in_(("claimed", "running")))
        .group_by(runs.c.owner, runs.c.state)
    )
    unstarted = sa.select(jobs.c.owner, sa.func.count()).where(claimed_without_row()).group_by(jobs.c.owner)
    for engine in registry.engines:
        with engine.connect() as conn:
            for owner, count in conn.execute(due):
                counts.setdefault(owner, [0, 0, 0])[0] += count
            for owner, state, count in conn.execute(active):
                counts.setdefault(owner, [0, 0, 0])[1 if state == "claimed" else 2] += count
            for owner, count in conn.execute(unstarted):
                counts.setdefault(owner, [0, 0, 0])[1] += count
    found = []
    for owner in sorted(counts):
        due_now, waiting, running = counts[owner]
        weight = weight_of.get(owner, DEFAULT_WEIGHT)
        found.append(OwnerActivity(owner, weight, due_now, waiting, running, paused=owner in paused))
    return found


def revoke_key(registry: Registry, key_id: str) -> KeyInfo:
    """Revoke the key whose id is `key_id`; repeating it answers the key as it is.

    ValueError for an id that is not KEY_ID_CHARS hex digits or names several keys,
    NotFound for none.
    """
    key_id = key_id.strip().lower()
    if len(key_id) != KEY_ID_CHARS or any(c not in "0123456789abcdef" for c in key_id):
        raise ValueError(f"a key id is {KEY_ID_CHARS} hex digits, as `punctual keys list` shows it")
    with registry.home.begin() as conn:
        found = (
            conn.execute(
                sa.select(api_keys.c.key_hash).where(api_keys.c.key_hash.startswith(key_id)).limit(2)
            )
            .scalars()
            .all()
        )
        if not found:
            raise NotFound("key")
        if len(found) > 1:  # 48 bits make this rare, not impossible
            raise ValueError(f"{key_id} names more than one key; revoke by the whole hash is not offered")
        conn.execute(
            api_keys.update()
            .where(api_keys.c.key_hash == found[0], api_keys.c.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )
        row = conn.execute(sa.select(api_keys).where(api_keys.c.key_hash == found[0])).mappings().one()
    return _info(row)


def rotate_secret(registry: Registry, owner: str, window_s: float, now: datetime) -> Rotation:
    """A new signing secret for `owner`; the current one keeps signing for `window_s`.

    A rotation during another's window replaces that window: the secret before the
    current one stops signing at once.
    """
    new = _new_secret()
    until = now + timedelta(seconds=window_s)
    with registry.home.begin() as conn:
        updated = conn.execute(
            owners.update()
            .where(owners.c.owner == owner)
            .values(
                previous_signing_secret=owners.c.signing_secret,
                previous_secret_until=until,
                signing_secret=new,
            )
            .returning(owners.c.owner)
        ).first()
    if updated is None:
        raise NotFound("owner")
    return Rotation(owner, new, until)


def _info(row: Any) -> KeyInfo:
    return KeyInfo(key_id_of(row["key_hash"]), row["owner"], row["created_at"], row["revoked_at"])


class OwnerDirectory:
    """Cached key -> owner and owner -> signing secrets lookups for one registry."""

    def __init__(
        self, registry: Registry, ttl_s: float = KEY_CACHE_TTL_S, secret_ttl_s: float = SECRET_CACHE_TTL_S
    ):
        self.registry = registry
        self.ttl_s = ttl_s
        self.secret_ttl_s = secret_ttl_s
        self._owners = _Recent(KEY_CACHE_MAX)  # key hash -> owner
        self._unknown = _Recent(KEY_CACHE_MAX)  # key hashes that name no owner
        self._secrets: dict[str, tuple[float, tuple | None]] = {}
        self._claim_view: tuple[float, ClaimView] | None = None
        self._lock = threading.Lock()

    def authenticate(self, api_key: str | None) -> str | None:
        """The owner of `api_key`, or None for an unknown, revoked or missing key."""
        if not api_key:
            return None
        digest = hash_key(api_key)
        now = time.monotonic()
        with self._lock:
            owner = self._owners.get(digest, now)
            if owner is not None:
                return owner
            if self._unknown.get(digest, now) is not None:
                return None
        with self.registry.home.connect() as conn:
            row = conn.execute(
                sa.select(api_keys.c.key_hash, api_keys.c.owner).where(
                    api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None)
                )
            ).first()
        owner = row.owner if row is not None and hmac.compare_digest(row.key_hash, digest) else None
        with self._lock:
            if owner is None:
                self._unknown.put(digest, True, time.monotonic() + self.ttl_s)
            else:
                self._owners.put(digest, owner, time.monotonic() + self.ttl_s)
        return owner

    def signing_secret(self, owner: str) -> str | None:
        """The owner's current signing secret (what a receiver should hold)."""
        found = self.signing_secrets(owner)
        return found[0] if found else None

    def signing_secrets(self, owner: str) -> tuple[str, ...]:
        """The secrets that sign the owner's calls: the current one, then the previous
        one while its rotation window lasts. Empty for an unknown owner."""
        cached = self._cached(self._secrets, owner)
        return _in_effect(cached[0] if cached is not None else self._read_secrets([owner])[owner])

    def cached_signing_secrets(self, owner: str) -> tuple[str, ...] | None:
        """signing_secrets(owner) if they are cached (no round trip), else None."""
        cached = self._cached(self._secrets, owner)
        return _in_effect(cached[0]) if cached is not None else None

    def prefetch_secrets(self, names: Iterable[str]) -> None:
        """Read the signing secrets of every owner in `names` that is not cached, in one
        query: a worker asks for the owners of a dispatch message before its calls, so
        that its calls find them cached instead of each asking the home database
        (with a thousand owners, that was a query per call and a connection pool
        overflowing into new connections)."""
        now = time.monotonic()
        with self._lock:
            missing = sorted({n for n in names if (hit := self._secrets.get(n)) is None or hit[0] <= now})
        if missing:
            self._read_secrets(missing)

    def _read_secrets(self, names: list[str]) -> dict[str, tuple | None]:
        """The stored secrets of `names` (None for an unknown owner), read in one query
        and cached."""
        with self.registry.home.connect() as conn:
            rows = conn.execute(
                sa.select(
                    owners.c.owner,
                    owners.c.signing_secret,
                    owners.c.previous_signing_secret,
                    owners.c.previous_secret_until,
                ).where(key_in(conn, owners.c.owner, names))
            ).all()
        found: dict[str, tuple | None] = {name: None for name in names}
        found.update((row.owner, tuple(row[1:])) for row in rows)
        for name, stored in found.items():
            self._store(self._secrets, name, stored, self.secret_ttl_s)
        return found

    def claim_view(self) -> ClaimView:
        """`claim_view(registry)`, cached for ttl_s: the claim asks before every batch,
        the relay sweep and the janitor before each pass."""
        cached = self._claim_view
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        found = claim_view(self.registry)
        self._claim_view = (time.monotonic() + self.ttl_s, found)
        return found

    def weights(self) -> dict[str, int]:
        """The owners' weights that are not the default (claim_view, cached)."""
        return self.claim_view().weights

    def paused(self) -> frozenset[str]:
        """The paused owners (claim_view, cached)."""
        return self.claim_view().paused

    def _cached(self, table: dict, key: str) -> tuple[Any] | None:
        with self._lock:
            hit = table.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return (hit[1],)
        return None

    def _store(self, table: dict, key: str, value: Any, ttl_s: float) -> None:
        with self._lock:
            table[key] = (time.monotonic() + ttl_s, value)


class _Recent:
    """At most `size` entries, each until its expiry (time.monotonic()); past the size
    the least recently used leaves. Not thread-safe: its owner holds a lock."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def get(self, key: str, now: float) -> Any:
        """The value of `key`, or None when it has none or it expired."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit[1]

    def put(self, key: str, value: Any, until: float) -> None:
        self._entries[key] = (until, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def _in_effect(stored: tuple | None) -> tuple[str, ...]:
    """The secrets that sign now, of an owner's stored (current, previous, until)."""
    if stored is None:
        return ()
    current, previous, until = stored
    # The window is judged at signing time, not at caching time: it ends on the second.
    if previous is not None and until is not None and utcnow() < until:
        return (current, previous)
    return (current,)
