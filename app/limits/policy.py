"""Which limits apply to a run (pure): docs/api.md "Limits".

A run is subject to at most three specs:

- the job's own `limits` (rate_per_s, max_concurrency), under its named `key` or,
  without one, under the target's origin (`scheme://host:port`, port always
  written; a queue target's topic); both scoped to the owner, so two owners never
  share a bucket by choosing the same name;
- the operator's defaults (PUNCTUAL_TARGET_RATE_PER_S, PUNCTUAL_TARGET_MAX_CONCURRENCY,
  0 = none) under the target's origin ACROSS ALL OWNERS: they protect a target from
  Punctual as a whole, on top of whatever the owners chose;
- the owner's quota (PUNCTUAL_OWNER_MAX_IN_FLIGHT, 0 = none): a concurrency cap on
  all of the owner's calls, whatever the target, so that one owner's burst leaves
  the workers' calls in flight to the others.

A run is admitted only when every spec admits it (app.limits.limiter).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["LimitSpec", "limit_specs", "owner_quota", "target_origin"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class LimitSpec:
    """One token bucket and/or concurrency cap, shared by every run with this key.

    `rate_per_s`: starts per second (the bucket holds that many tokens: one second
    of burst); `max_concurrency`: runs in flight at once. None = no such limit.
    """

    key: str
    rate_per_s: float | None = None
    max_concurrency: int | None = None

    @property
    def limited(self) -> bool:
        return bool(self.rate_per_s) or bool(self.max_concurrency)


def target_origin(target: Mapping[str, Any]) -> str:
    """`scheme://host:port` of a webhook target, `topic:<topic>` of a queue target,
    `database:<alias>` of a postgres target.

    The host is lowercased and the port always written, so https://API.example/x
    and https://api.example:443/y share one origin.
    """
    if target.get("type") == "queue":
        return f"topic:{target.get('topic', '')}"
    if target.get("type") == "postgres":
        return f"database:{target.get('database', '')}"
    url = str(target.get("url", ""))
    # Every run's limits are keyed by its origin, and a burst calls a few origins many
    # times, each job often at a path of its own: the origin is parsed once per
    # scheme://authority, the part of the URL before its path, query or fragment.
    authority = _AUTHORITY.match(url)
    return _url_origin(authority.group(0)) if authority else _url_origin.__wrapped__(url)


_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


@functools.lru_cache(maxsize=1024)
def _url_origin(url: str) -> str:
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), (parts.hostname or "").rstrip(".")
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    except ValueError:  # validated at the API; a key is still owed to whatever came through
        return url
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def limit_specs(
    owner: str,
    target: Mapping[str, Any],
    settings: Any,
    named: Mapping[tuple[str, str], tuple[float | None, int | None]] | None = None,
) -> list[LimitSpec]:
    """The specs a run of `owner`'s job with `target` must pass (possibly none).

    `settings` needs `target_rate_per_s` and `target_max_concurrency` (0 = none), and
    may have `owner_max_in_flight` (0 = none).
    `named` maps (owner, key name) to the limits recorded for that named key (those
    of the job most recently created or updated with it: app.limits.keys); a named
    key found there takes those limits instead of this run's own snapshot.
    """
    origin = target_origin(target)
    scope = f"owner:{quote(str(owner), safe='')}"  # quoted: no owner name can forge another's key
    specs: list[LimitSpec] = []
    limits = target.get("limits") or {}
    name = limits.get("key")
    rate, concurrency = limits.get("rate_per_s"), limits.get("max_concurrency")
    if name and named and (str(owner), str(name)) in named:
        rate, concurrency = named[(str(owner), str(name))]
    if rate or concurrency:
        key = f"{scope}:key:{name}" if name else f"{scope}:{origin}"
        specs.append(LimitSpec(key, float(rate) if rate else None, int(concurrency) if concurrency else None))
    default_rate = float(getattr(settings, "target_rate_per_s", 0) or 0)
    default_concurrency = int(getattr(settings, "target_max_concurrency", 0) or 0)
    if default_rate or default_concurrency:
        specs.append(_default_spec(origin, default_rate or None, default_concurrency or None))
    quota = int(getattr(settings, "owner_max_in_flight", 0) or 0)
    if quota:
        specs.append(owner_quota(owner, quota))
    return specs


@functools.lru_cache(maxsize=1024)  # a burst's runs share a few origins; a spec is immutable
def _default_spec(origin: str, rate_per_s: float | None, max_concurrency: int | None) -> LimitSpec:
    """The operator's default limits of a target's origin, across all owners."""
    return LimitSpec(f"all:{origin}", rate_per_s, max_concurrency)


def owner_quota(owner: str, max_in_flight: int) -> LimitSpec:
    """The cap on all of `owner`'s calls in flight (its key names no target, so no
    job's own key or origin can be it)."""
    return LimitSpec(f"owner-total:{quote(str(owner), safe='')}", None, max_in_flight)
