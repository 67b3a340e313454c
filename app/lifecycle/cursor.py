"""A job's cursor: which occurrence comes next. Pure; reads a job row, writes nothing.

Used by the claim (a misfire that runs nothing moves the cursor), the completion
and the janitor (a finished occurrence moves it on). The next occurrence is always
computed from a nominal instant (the run's scheduled_for), never from now
(invariant 6), with the job row's schedule as it is at that moment, so a PATCH
during a run applies from the next occurrence -- and never before the PATCH itself:
an occurrence of the new schedule that lies between the run's instant and the change
would be due at once, and an edited schedule must not fire the job at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core import jitter
from app.core.misfire import Occurrence, find_backlog
from app.core.schedules import next_cron_fire, next_fire
from app.registry.records import dst_of, schedule_of

# The most occurrences one move records `skipped` (a run in flight for a week of a
# 1-second job is counted, not written 600,000 times); as the claim's run_all cap.
SKIPPED_CAP = 1000

# The columns of a job row that `advance` and `occurrence` read: its schedule, DST
# policy, anchor, jitter and run_all's skipped range.
CURSOR_COLUMNS = (
    "job_id",
    "schedule_kind",
    "run_at",
    "cron",
    "timezone",
    "interval_s",
    "start_at",
    "end_at",
    "dst_gap",
    "dst_overlap",
    "created_at",
    "jitter_s",
    "skipped_after",
    "skipped_through",
    "rescheduled_at",
)


@dataclass(frozen=True)
class Advance:
    """Where the cursor goes: `next` (None when the schedule is over), and whether
    the run_all skipped range has now been stepped over and can be forgotten."""

    next: Occurrence | None
    clear_skipped_range: bool


def occurrence(job: Mapping[str, Any], nominal: datetime) -> Occurrence:
    """An occurrence of this job: its nominal instant and its jittered fire instant."""
    jitter_s = job["jitter_s"]
    if jitter_s == 0:  # no jitter: no digest to compute
        return Occurrence(nominal, nominal)
    return Occurrence(nominal, jitter.fire_at(job["job_id"], nominal, jitter_s))


def following(job: Mapping[str, Any], after: datetime) -> datetime | None:
    """The job's first nominal occurrence strictly after `after` (None: none remains),
    by its schedule alone: next_fire of the row's schedule. A cron row looks its answer
    up by its columns (app.core.schedules.next_cron_fire), building no Schedule: the
    claim and the completion of a burst ask this once per run, and nearly always of
    an answer computed already."""
    if job["schedule_kind"] == "cron":
        return next_cron_fire(
            job["cron"],
            job["timezone"],
            job["start_at"],
            job["end_at"],
            job["dst_gap"],
            job["dst_overlap"],
            after,
        )
    return next_fire(schedule_of(job), dst_of(job), after, job["created_at"])


def advance(job: Mapping[str, Any], after: datetime) -> Advance:
    """The occurrence after nominal instant `after`, and after the job's last change of
    schedule (`rescheduled_at`: an occurrence of the new schedule before the change
    is not one the job ever had).

    run_all's cap recorded occurrences in (skipped_after, skipped_through] as
    skipped; when the next occurrence falls in that range the cursor jumps past it.
    """
    rescheduled_at = job.get("rescheduled_at")
    if rescheduled_at is not None and rescheduled_at > after:
        after = rescheduled_at
    nominal = following(job, after)
    skipped_after, skipped_through = job.get("skipped_after"), job.get("skipped_through")
    clear = False
    if skipped_through is not None:
        if nominal is not None and skipped_after is not None and skipped_after < nominal <= skipped_through:
            nominal = following(job, skipped_through)
            clear = True
        elif nominal is None or nominal > skipped_through:
            clear = True
    return Advance(None if nominal is None else occurrence(job, nominal), clear)


@dataclass(frozen=True)
class PastTheRun:
    """Where an `overlap: skip` job goes when its run ends: `next` (None when the
    schedule is over), the occurrences that fell due while the run was in flight
    (`skipped`, at most SKIPPED_CAP, oldest first) and how many more there were."""

    next: Occurrence | None
    skipped: tuple[Occurrence, ...] = ()
    unrecorded: int = 0


def past_the_run(job: Mapping[str, Any], following: Occurrence | None, now: datetime) -> PastTheRun:
    """From `following` (the occurrence after the run's own), every occurrence already
    due at `now` (its fire instant passed while the run was in flight) is skipped, and
    the job goes to the first one still ahead."""
    if following is None or following.fire_at > now:
        return PastTheRun(following)
    backlog = find_backlog(
        schedule_of(job),
        dst_of(job),
        job["created_at"],
        job["job_id"],
        job["jitter_s"],
        following,
        now,
        limit=SKIPPED_CAP,
    )
    assert backlog.latest is not None  # `following` is due: the backlog holds it at least
    known = list(backlog.oldest)
    if known[-1].nominal != backlog.latest.nominal:
        known.append(backlog.latest)
    recorded = tuple(known[:SKIPPED_CAP])
    total = backlog.count if backlog.count is not None else len(known) + backlog.truncated
    return PastTheRun(advance(job, backlog.latest.nominal).next, recorded, max(0, total - len(recorded)))
