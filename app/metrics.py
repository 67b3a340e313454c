"""Prometheus metrics, defined once for every process; their names are part of the contract (docs/api.md).

Workers and pollers count what they do (polls, claims and their batch sizes, runs
started and finished by outcome, start lateness, lease expiries, stale completions,
dead letters); the API adds registry gauges (jobs by state, backlog and its age per
shard), computed at scrape time, whose names and help are REGISTRY_GAUGES. A worker
serves the sum over all its processes on PUNCTUAL_METRICS_PORT, the API on GET
/metrics (app.metrics_endpoint). The alert rules in deploy/prometheus/alerts.yml
name only metrics of this module (tests/unit/test_alert_rules.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import Counter, Histogram

POLLS = Counter(
    "punctual_polls_total",
    "Poll ticks that ran to the end, per logical shard (a fenced shard's included): a shard "
    "whose rate is 0 is not being polled",
    ["shard"],
)
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
SLOTS_HANDED_OVER = Counter(
    "punctual_slots_handed_over_total",
    "Concurrency slots passed straight from a call that ended to a run waiting in the same process",
)
DEAD_LETTERS = Counter("punctual_dead_letters_total", "Runs that became dead")
COMPLETIONS_GIVEN_UP = Counter(
    "punctual_completions_given_up_total",
    "Finished attempts whose outcome could not be written at all; their leases run out and the janitor "
    "takes them back",
)
LEASES_EXPIRED = Counter("punctual_leases_expired_total", "Leases the janitor took back", ["shard"])
PUBLISHED = Counter("punctual_dispatch_messages_total", "Dispatch messages published", ["shard"])
START_LATENESS = Histogram(
    "punctual_start_lateness_seconds",
    "When a run's call goes out (after its concurrency slot) minus its nominal scheduled instant",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600),
)
REPLICA_SKIPPED_READS = Counter(
    "punctual_replica_skipped_reads_total",
    "Replica reads sent to the primary because no replica of it was usable: lag (more than "
    "PUNCTUAL_REPLICA_MAX_LAG_S behind), down (not answering), refused (not a replica of it)",
    ["reason"],
)

# The API's registry gauges (app.api.ops.RegistryGauges), read from the databases at
# scrape time rather than counted: their names and help, for the API and the alert rules.
REGISTRY_GAUGES = {
    "punctual_jobs": "Jobs in the registry by state",
    "punctual_dead_letter_runs": "Runs in state dead (dead letters)",
    "punctual_backlog_jobs": "Jobs due and not claimed yet, per logical shard",
    "punctual_backlog_age_seconds": "How long the oldest job due and not claimed yet has been due, "
    "per logical shard (0: none)",
}

# Per owner: one series per owner and event in each process that saw the owner (claimed
# in pollers; started and held in workers). Their number grows with the owners that
# have runs: fine for hundreds or a few thousand owners, too many for a registry of
# hundreds of thousands, where these should be dropped at scrape (docs/api.md
# "Operations"). Waiting = claimed - started - held, per owner.
OWNER_RUNS = Counter(
    "punctual_owner_runs_total",
    "Runs per owner: claimed (by a poller), started and held (by a worker)",
    ["owner", "event"],
)


def count_by_owner(event: str, owners) -> None:
    """Count one `event` for each owner in `owners` (an iterable, with repeats)."""
    counts: dict[str, int] = {}
    for owner in owners:
        counts[owner] = counts.get(owner, 0) + 1
    for owner, count in counts.items():
        OWNER_RUNS.labels(owner, event).inc(count)


def observe_many(histogram: Histogram, amounts: Sequence[float]) -> None:
    """Observe each of `amounts` in `histogram` (one without labels, or one child), as
    `observe` would one by one, with one write for the sum and one per bucket that
    gains: in a worker process each write of a metric is a lock and a write to a file
    the processes share, so observing each run's start lateness alone was a cost the
    calls' loop paid per run. The histogram's own buckets and sum are
    written, as observe writes them (each amount counts in the first bucket whose
    bound is at or above it)."""
    if not amounts:
        return
    bounds = histogram._upper_bounds
    gained = [0] * len(bounds)
    for amount in amounts:
        gained[bisect_left(bounds, amount)] += 1
    histogram._raise_if_not_observable()
    histogram._sum.inc(sum(amounts))
    for bucket, count in zip(histogram._buckets, gained, strict=True):
        if count:
            bucket.inc(count)
