"""Prometheus metrics, defined once for every process; their names are part of the contract (docs/api.md).

Workers and pollers count what they do (claims and their batch sizes, runs started
and finished by outcome, start lateness, lease expiries, stale completions, dead
letters); the API adds registry gauges (jobs by state, backlog per shard) computed
at scrape time. A worker serves the sum over all its processes on
PUNCTUAL_METRICS_PORT, the API on GET /metrics (app.metrics_endpoint).
"""
from __future__ import annotations

from prometheus_client import Counter, Histogram

CLAIMS = Counter("punctual_claims_total", "Occurrences claimed by pollers", ["shard"])
CLAIM_BATCHES = Counter(
    "punctual_claim_batches_total", "Claim transactions that took at least one job", ["shard"]
)
CLAIM_BATCH_SIZE = Histogram(
    "punctual_claim_batch_size",
    "Due jobs taken by one claim transaction (0: none was due); one observation per claim",
    buckets=(0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
)
RUNS_STARTED = Counter("punctual_runs_started_total", "Runs started: their target is being called", ["shard"])
RUNS = Counter(
    "punctual_runs_total",
    "Runs by outcome: succeeded, failed (a retry follows), dead, skipped (misfire), "
    "held (a limit deferred it)",
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
