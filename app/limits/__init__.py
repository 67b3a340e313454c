"""Per-target rate limits and concurrency caps (docs/api.md "Limits").

`limit_specs` (pure policy) says which limits a run is subject to; a `Limiter`
admits runs under them, atomically and for a whole batch at a time. Workers share
limits through Redis when PUNCTUAL_REDIS_URL is set; without it (`punctual dev`),
the process's in-memory limiter stands in.
"""

from __future__ import annotations

import threading
from typing import Any

from app.limits.limiter import Admission, Limiter
from app.limits.local_limiter import LocalLimiter
from app.limits.policy import LimitSpec, limit_specs, target_origin
from app.limits.redis_limiter import RedisLimiter

__all__ = [
    "Admission",
    "Limiter",
    "LimitSpec",
    "LocalLimiter",
    "RedisLimiter",
    "limit_specs",
    "limiter_for",
    "target_origin",
]

_limiters: dict[tuple[str, str], Limiter] = {}
_lock = threading.Lock()


def limiter_for(settings: Any) -> Limiter:
    """The process's limiter for these settings: one per (Redis URL, prefix).

    Without a Redis URL every caller in the process gets the same LocalLimiter, so
    the limits still hold across the threads of `punctual dev`.
    """
    identity = (settings.redis_url or "", settings.redis_prefix if settings.redis_url else "")
    with _lock:
        limiter = _limiters.get(identity)
        if limiter is None:
            if settings.redis_url:
                limiter = RedisLimiter.from_url(settings.redis_url, settings.redis_prefix)
            else:
                limiter = LocalLimiter()
            _limiters[identity] = limiter
        return limiter
