"""The figures every burst benchmark reports, computed from the sink's arrivals alone.

Pure functions (no I/O), so that Punctual and its peers are judged by the same code
on the same evidence: when each job's first call reached the sink.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    """One call received by the sink (one access-log line)."""

    at: float  # Unix time, millisecond resolution ($msec)
    path: str  # the request URI: /hook/<job index>
    attempt: str  # Punctual-Attempt header, "" when absent
    key: str  # Idempotency-Key header, "" when absent
    scheduled_for: str  # Punctual-Scheduled-For header, "" when absent


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..1) of values; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def lateness_figures(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max of lateness values in seconds, rounded to the millisecond."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(values, 0.5), 3),
        "p90": round(percentile(values, 0.9), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
    }


def per_second(offsets: list[float]) -> list[int]:
    """How many offsets (seconds after T) fall in each whole second from T on."""
    if not offsets:
        return []
    bins = [0] * (int(max(0.0, max(offsets))) + 1)
    for offset in offsets:
        bins[int(max(0.0, offset))] += 1
    return bins


def burst_figures(arrivals: list[Arrival], jobs: int, due: float, paths: set[str] | None = None) -> dict:
    """The burst's figures: N jobs all due at `due` (Unix time), job i calling its own path.

    - starts/s from T = N started / (the last first arrival - T);
    - lateness = each path's first arrival - T;
    - missing = expected paths that never arrived;
    - duplicate calls = arrivals of an Idempotency-Key already seen (a job called
      twice), and repeated paths (the same job's path twice, whatever the key).
    `paths` is the set of expected paths; without it every path that arrived counts.
    """
    first: dict[str, float] = {}
    for arrival in arrivals:
        if paths is not None and arrival.path not in paths:
            continue
        if arrival.path not in first or arrival.at < first[arrival.path]:
            first[arrival.path] = arrival.at
    lateness = [at - due for at in first.values()]
    keys = Counter(a.key for a in arrivals if a.key)
    path_counts = Counter(a.path for a in arrivals if paths is None or a.path in paths)
    started = len(first)
    last = max(lateness) if lateness else None
    return {
        "jobs": jobs,
        "started": started,
        "missing": jobs - started,
        "calls_received": len(arrivals),
        "duplicate_calls": sum(count - 1 for count in keys.values()),
        "paths_called_twice": sum(1 for count in path_counts.values() if count > 1),
        "retried_attempts": sum(1 for a in arrivals if a.attempt not in ("", "1")),
        "first_arrival_after_due_s": round(min(lateness), 3) if lateness else None,
        "last_first_arrival_after_due_s": round(last, 3) if last is not None else None,
        "starts_per_s": round(started / last, 1) if last and last > 0 else None,
        "lateness_s": lateness_figures(lateness),
        "starts_per_second": per_second(lateness),
    }
