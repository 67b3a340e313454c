"""Owners, their API keys, signing secrets and weights.

An owner's weight (default 1) is its share of each claim batch relative to the other
owners with due rows (app.pollers.shares); `punctual owners set OWNER --weight N`.

Owners and keys live on the home DSN (logical shard 0's). Only the SHA-256 of a key
is stored; a request's key is hashed and looked up, then compared in constant time.
Lookups are cached briefly per process because every request and every signed call
needs one.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.pollers.shares import DEFAULT_WEIGHT, MAX_WEIGHT
from app.registry.engines import Registry
from app.registry.schema import api_keys, jobs, owners, runs

KEY_PREFIX = "pk_"
CACHE_TTL_S = 30.0


@dataclass(frozen=True)
class NewKey:
    owner: str
    api_key: str
    signing_secret: str

    def as_dict(self) -> dict:
        return {"owner": self.owner, "api_key": self.api_key, "signing_secret": self.signing_secret}


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


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
            secret = "whsec_" + secrets.token_urlsafe(32)
            conn.execute(owners.insert().values(owner=owner, signing_secret=secret, created_at=now))
        conn.execute(api_keys.insert().values(key_hash=hash_key(api_key), owner=owner, created_at=now))
    return NewKey(owner, api_key, secret)


@dataclass(frozen=True)
class OwnerActivity:
    """An owner as `punctual owners` shows it: its weight and what it has on the way
    right now, counted in the registry (every DSN)."""

    owner: str
    weight: int
    due: int  # scheduled jobs whose next_run_at has come, not claimed yet
    waiting: int  # runs claimed, not started (in a dispatch message, or waiting in a worker)
    running: int  # runs started, their call in flight

    def as_dict(self) -> dict:
        return {"owner": self.owner, "weight": self.weight, "due": self.due, "waiting": self.waiting,
                "running": self.running}


def set_weight(registry: Registry, owner: str, weight: int) -> None:
    """Store `owner`'s weight; the pollers see it within CACHE_TTL_S."""
    if not DEFAULT_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be an integer from {DEFAULT_WEIGHT} to {MAX_WEIGHT}")
    with registry.home.begin() as conn:
        update = sa.update(owners).where(owners.c.owner == owner).values(weight=weight)
        changed = conn.execute(update).rowcount
    if not changed:
        raise LookupError(f"no owner {owner!r} (owners are made by `punctual keys create --owner`)")


def weights(registry: Registry) -> dict[str, int]:
    """The owners whose weight is not the default (the rest weigh DEFAULT_WEIGHT)."""
    with registry.home.connect() as conn:
        query = sa.select(owners.c.owner, owners.c.weight).where(owners.c.weight != DEFAULT_WEIGHT)
        return {row.owner: row.weight for row in conn.execute(query)}


def activity(registry: Registry) -> list[OwnerActivity]:
    """Every owner with its weight and its due, waiting and running counts, by name."""
    now = utcnow()
    with registry.home.connect() as conn:
        query = sa.select(owners.c.owner, owners.c.weight)
        weight_of = {row.owner: row.weight for row in conn.execute(query)}
    counts: dict[str, list[int]] = {owner: [0, 0, 0] for owner in weight_of}
    due = (sa.select(jobs.c.owner, sa.func.count())
           .where(jobs.c.state == "scheduled", jobs.c.next_run_at <= now)
           .group_by(jobs.c.owner))
    active = (sa.select(runs.c.owner, runs.c.state, sa.func.count())
              .where(runs.c.state.in_(("claimed", "running")))
              .group_by(runs.c.owner, runs.c.state))
    for engine in registry.engines:
        with engine.connect() as conn:
            for owner, count in conn.execute(due):
                counts.setdefault(owner, [0, 0, 0])[0] += count
            for owner, state, count in conn.execute(active):
                counts.setdefault(owner, [0, 0, 0])[1 if state == "claimed" else 2] += count
    return [OwnerActivity(owner, weight_of.get(owner, DEFAULT_WEIGHT), *counts[owner])
            for owner in sorted(counts)]


class OwnerDirectory:
    """Cached key -> owner and owner -> signing secret lookups for one registry."""

    def __init__(self, registry: Registry, ttl_s: float = CACHE_TTL_S):
        self.registry = registry
        self.ttl_s = ttl_s
        self._owners: dict[str, tuple[float, str | None]] = {}
        self._secrets: dict[str, tuple[float, str | None]] = {}
        self._weights: tuple[float, dict[str, int]] | None = None
        self._lock = threading.Lock()

    def authenticate(self, api_key: str | None) -> str | None:
        """The owner of `api_key`, or None for an unknown or missing key."""
        if not api_key:
            return None
        digest = hash_key(api_key)
        cached = self._cached(self._owners, digest)
        if cached is not None:
            return cached[0]
        with self.registry.home.connect() as conn:
            row = conn.execute(
                sa.select(api_keys.c.key_hash, api_keys.c.owner).where(api_keys.c.key_hash == digest)
            ).first()
        owner = row.owner if row is not None and hmac.compare_digest(row.key_hash, digest) else None
        self._store(self._owners, digest, owner)
        return owner

    def signing_secret(self, owner: str) -> str | None:
        cached = self._cached(self._secrets, owner)
        if cached is not None:
            return cached[0]
        with self.registry.home.connect() as conn:
            secret = conn.execute(sa.select(owners.c.signing_secret).where(owners.c.owner == owner)).scalar()
        self._store(self._secrets, owner, secret)
        return secret

    def weights(self) -> dict[str, int]:
        """`weights(registry)`, cached for ttl_s: the claim asks before every batch."""
        cached = self._weights
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        found = weights(self.registry)
        self._weights = (time.monotonic() + self.ttl_s, found)
        return found

    def _cached(self, table: dict, key: str) -> tuple[str | None] | None:
        with self._lock:
            hit = table.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return (hit[1],)
        return None

    def _store(self, table: dict, key: str, value: str | None) -> None:
        with self._lock:
            table[key] = (time.monotonic() + self.ttl_s, value)
