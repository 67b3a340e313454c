"""Misfires: what a claim does when a recurring job has fallen behind.

A job falls behind when Punctual was down, the job was paused, or the shard was
slow. When a claim finds it, `find_backlog` lists what is due and `decide_misfire`
turns the job's policy into a value: which occurrences run now, which are recorded
as `skipped`. The caller applies the decision and moves next_run_at past
`backlog.latest`; nothing here touches the registry.

An occurrence is missed when its first claim comes more than the grace
(PUNCTUAL_MISFIRE_GRACE_S) after its fire instant (nominal + jitter). Retries, runs
held by a limit and replays are never misfires; the caller does not ask here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.core import jitter
from app.core.schedules import DstPolicy, Schedule, count_fires, iter_fires, latest_fire

MISFIRE_POLICIES = ("run_once", "run_all", "skip")


@dataclass(frozen=True)
class Occurrence:
    nominal: datetime  # the scheduled instant: the idempotency key's time
    fire_at: datetime  # nominal + jitter: when it is due


@dataclass(frozen=True)
class Backlog:
    """What is due for one job at one claim.

    The backlog is the job's occurrences from its current one (`first`) up to
    `latest`, the most recent one whose fire_at has passed. With jitter wider than
    the schedule's spacing, an occurrence before `latest` may not have reached its
    own fire_at yet; it is in the backlog anyway, because the job's cursor only
    moves forward and must not step over an occurrence without accounting for it.
    """

    oldest: tuple[Occurrence, ...]  # the backlog's start, oldest first, at most `limit`
    latest: Occurrence | None  # the most recent due occurrence (may lie beyond `oldest`)
    truncated: bool  # some due occurrences are in neither `oldest` nor `latest`
    count: int | None = None  # how many are due in all; None when only a walk could tell


@dataclass(frozen=True)
class MisfireDecision:
    run: tuple[Occurrence, ...]  # to run, oldest first
    skipped: tuple[Occurrence, ...]  # to record as `skipped` runs (at most `cap`)
    unrecorded_skips: (
        int  # skipped beyond those listed (exact when Backlog.count is known, else a lower bound)
    )


def find_backlog(
    schedule: Schedule,
    dst: DstPolicy,
    anchor: datetime,
    job_id: uuid.UUID | str,
    jitter_s: int,
    first: Occurrence,
    now: datetime,
    limit: int = 1001,
) -> Backlog:
    """The due occurrences from `first` (the job's current nominal and next_run_at).

    Stays fast for a 1-second job that was down for a week (600,000 occurrences):
    `latest` comes from a search, not a walk, and only `limit` are enumerated.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if first.fire_at > now:
        return Backlog(oldest=(), latest=None, truncated=False, count=0)

    def occurrence(nominal: datetime) -> Occurrence:
        return Occurrence(nominal, jitter.fire_at(job_id, nominal, jitter_s))

    # An occurrence at or before now - jitter_s is due whatever its jitter (which is
    # < jitter_s); only the last jitter_s seconds before now need checking one by one.
    surely_due = latest_fire(schedule, dst, anchor, first.nominal, now - timedelta(seconds=jitter_s))
    latest = first if surely_due is None else occurrence(surely_due)
    for nominal in iter_fires(schedule, dst, latest.nominal, anchor):
        if nominal > now:  # jitter only delays, so nothing later can be due
            break
        candidate = occurrence(nominal)
        if candidate.fire_at <= now:
            latest = candidate

    oldest = [first]
    truncated = False
    if latest.nominal > first.nominal:
        for nominal in iter_fires(schedule, dst, first.nominal, anchor):
            if nominal >= latest.nominal or len(oldest) >= limit:
                truncated = nominal < latest.nominal
                break
            oldest.append(occurrence(nominal))
        if len(oldest) < limit:
            oldest.append(latest)

    after_first = count_fires(schedule, dst, anchor, first.nominal, latest.nominal)
    if after_first is not None:
        count: int | None = 1 + after_first
    elif not truncated:
        count = len(oldest) + (oldest[-1] != latest)
    else:
        count = None
    return Backlog(oldest=tuple(oldest), latest=latest, truncated=truncated, count=count)


def decide_misfire(
    policy: str, backlog: Backlog, now: datetime, grace_s: float, cap: int = 1000
) -> MisfireDecision:
    """Apply a misfire policy to a backlog (docs/api.md "Misfires").

    - One due occurrence within the grace runs, whatever the policy.
    - run_once: the most recent due occurrence runs; the others are skipped.
    - run_all: each runs, oldest first, the `cap` oldest; the rest are skipped.
    - skip: the most recent runs only if it is within the grace; the others are skipped.

    At most `cap` skips are listed (the oldest ones, and always `latest` if it is
    skipped); `unrecorded_skips` counts the rest, so a week of a 1-second job does
    not write 600,000 history rows.
    """
    if policy not in MISFIRE_POLICIES:
        raise ValueError(f"unknown misfire policy {policy!r}")
    latest = backlog.latest
    if latest is None:
        return MisfireDecision(run=(), skipped=(), unrecorded_skips=0)
    known = list(backlog.oldest)
    if not known or known[-1].nominal != latest.nominal:
        known.append(latest)
    total = backlog.count if backlog.count is not None else len(known) + backlog.truncated

    if policy == "run_all":
        # Never run past a hole: with a truncated backlog, only `oldest` is contiguous.
        runnable = list(backlog.oldest) if backlog.truncated else known
        run = runnable[:cap]
    elif policy == "run_once":
        run = [latest]
    else:
        within_grace = not is_missed(latest, now, grace_s)
        run = [latest] if within_grace else []
    chosen = {occurrence.nominal for occurrence in run}
    rest = [occurrence for occurrence in known if occurrence.nominal not in chosen]
    if len(rest) > cap:
        rest = rest[: cap - 1] + [latest] if rest[-1].nominal == latest.nominal else rest[:cap]
    return MisfireDecision(
        run=tuple(run), skipped=tuple(rest), unrecorded_skips=max(0, total - len(run) - len(rest))
    )


def is_missed(occurrence: Occurrence, now: datetime, grace_s: float) -> bool:
    """True when a first claim at `now` comes more than the grace after fire_at."""
    return (now - occurrence.fire_at).total_seconds() > grace_s


def skip_reason(policy: str, occurrence: Occurrence, now: datetime, grace_s: float) -> str:
    """The `error` recorded on a skipped occurrence: the truth about why it did not run.

    Missed: its claim came more than the grace after its fire instant. Otherwise it
    was on time, and a later occurrence due at the same claim superseded it
    (run_once and skip run the most recent one only; run_all skips only beyond its
    cap, which is always a miss).
    """
    if policy == "run_all" or is_missed(occurrence, now, grace_s):
        return f"missed occurrence (misfire policy {policy})"
    return f"superseded by a later occurrence ({policy})"


def parse_misfire(value: object) -> str:
    """The API's `misfire` field; None takes the default. Raises ValueError for a 422."""
    if value is None:
        return "run_once"
    if value not in MISFIRE_POLICIES:
        raise ValueError(f"must be one of {', '.join(MISFIRE_POLICIES)}")
    return value
