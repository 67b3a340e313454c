"""Owners, their API keys and signing secrets.

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
from app.registry.engines import Registry
from app.registry.schema import api_keys, owners

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


class OwnerDirectory:
    """Cached key -> owner and owner -> signing secret lookups for one registry."""

    def __init__(self, registry: Registry, ttl_s: float = CACHE_TTL_S):
        self.registry = registry
        self.ttl_s = ttl_s
        self._owners: dict[str, tuple[float, str | None]] = {}
        self._secrets: dict[str, tuple[float, str | None]] = {}
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

    def _cached(self, table: dict, key: str) -> tuple[str | None] | None:
        with self._lock:
            hit = table.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return (hit[1],)
        return None

    def _store(self, table: dict, key: str, value: str | None) -> None:
        with self._lock:
            table[key] = (time.monotonic() + self.ttl_s, value)
