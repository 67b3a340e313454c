"""Prometheus metrics, defined once for every process.

Workers and pollers count what they do (claims, runs by outcome, start lateness,
stale completions, dead letters); the API adds registry gauges (jobs by state)
computed at scrape time. Each process exposes its own: the API on GET /metrics,
workers through `PUNCTUAL_METRICS_PORT` (see app.celery).
"""
from __future__ import annotations

from prometheus_client import Counter, Histogram

CLAIMS = Counter("punctual_claims_total", "Occurrences claimed by pollers", ["shard"])
CLAIM_BATCHES = Counter("punctual_claim_batches_total", "Claim transactions committed", ["shard"])
RUNS = Counter(
    "punctual_runs_total",
    "Finished runs by outcome (succeeded, failed, dead, skipped, held)",
    ["outcome"],
)
STALE_COMPLETIONS = Counter(
    "punctual_stale_completions_total",
    "Completions or starts refused because the lease token no longer matched",
)
DEAD_LETTERS = Counter("punctual_dead_letters_total", "Runs that became dead")
LEASES_EXPIRED = Counter("punctual_leases_expired_total", "Leases the janitor took back", ["shard"])
PUBLISHED = Counter("punctual_dispatch_messages_total", "Dispatch messages published", ["shard"])
START_LATENESS = Histogram(
    "punctual_start_lateness_seconds",
    "Run start minus its nominal scheduled instant",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600),
)
