"""Named limits keys: one set of limits per (owner, key), last writer wins.

docs/api.md: jobs that share a limits key share one bucket and one cap, and "its limits
are those of the job most recently created or updated with it". The API records a
key's limits whenever a job is created or updated with it (`record_limit_key`);
workers read them back (`LimitKeyDirectory`, cached for a few seconds, so a change
reaches every worker within that time) and hand them to `limit_specs`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from app.registry.dialect import is_postgres
from app.registry.engines import Registry
from app.registry.schema import limit_keys

CACHE_TTL_S = 5.0

KeyLimits = tuple[float | None, int | None]  # (rate_per_s, max_concurrency)


def named_key(target: Mapping[str, Any]) -> str | None:
    limits = target.get("limits") or {}
    name = limits.get("key")
    return str(name) if name else None


def record_limit_key(registry: Registry, owner: str, target: Mapping[str, Any], now: datetime) -> None:
    """Make `target`'s limits the limits of its named key (no key: nothing to do)."""
    name = named_key(target)
    if name is None:
        return
    limits = target.get("limits") or {}
    values = {
        "rate_per_s": limits.get("rate_per_s"),
        "max_concurrency": limits.get("max_concurrency"),
        "updated_at": now,
    }
    engine = registry.home
    insert = postgresql.insert(limit_keys) if is_postgres(engine) else sqlite.insert(limit_keys)
    statement = insert.values(owner=owner, name=name, **values).on_conflict_do_update(
        index_elements=[limit_keys.c.owner, limit_keys.c.name], set_=values
    )
    with engine.begin() as conn:
        conn.execute(statement)


class LimitKeyDirectory:
    """Cached (owner, key) -> (rate_per_s, max_concurrency) lookups for one registry."""

    def __init__(self, registry: Registry, ttl_s: float = CACHE_TTL_S):
        self.registry = registry
        self.ttl_s = ttl_s
        self._cache: dict[tuple[str, str], tuple[float, KeyLimits | None]] = {}
        self._lock = threading.Lock()

    def lookup_many(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], KeyLimits]:
        """The recorded limits of each (owner, key) that has some; one query for the misses."""
        wanted = set(pairs)
        found: dict[tuple[str, str], KeyLimits] = {}
        missing: set[tuple[str, str]] = set()
        now = time.monotonic()
        with self._lock:
            for pair in wanted:
                hit = self._cache.get(pair)
                if hit is not None and hit[0] > now:
                    if hit[1] is not None:
                        found[pair] = hit[1]
                else:
                    missing.add(pair)
        if missing:
            condition = sa.tuple_(limit_keys.c.owner, limit_keys.c.name).in_(sorted(missing))
            with self.registry.home.connect() as conn:
                rows = conn.execute(
                    sa.select(
                        limit_keys.c.owner,
                        limit_keys.c.name,
                        limit_keys.c.rate_per_s,
                        limit_keys.c.max_concurrency,
                    ).where(condition)
                ).all()
            fetched = {(r.owner, r.name): (r.rate_per_s, r.max_concurrency) for r in rows}
            expires = time.monotonic() + self.ttl_s
            with self._lock:
                for pair in missing:
                    self._cache[pair] = (expires, fetched.get(pair))
            found.update(fetched)
        return found
