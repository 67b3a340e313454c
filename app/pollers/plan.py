"""What a claim does with one due job: a value, decided without I/O.

`plan_claim` applies the misfire rules of docs/api.md ("Misfires") through the pure core
(app.core.misfire) and returns a ClaimPlan; app.pollers.claim writes it. A job claimed
ahead of its fire instant (PUNCTUAL_CLAIM_AHEAD_S) is planned as at that instant:
it is on time, and its backlog is the current occurrence alone. The cases:

- misfire_exempt (a retry, a run held by a limit, a replay): run the current
  occurrence, no misfire question.
- a one-off: it runs, however late (a misfire policy is about a recurring job's
  missed occurrences; dropping the only occurrence would lose the job).
- run_all in the middle of a capped catch-up (the current occurrence is at or
  before skipped_after): run it; the backlog was decided at the first claim.
- otherwise: find_backlog + decide_misfire. run_once runs the latest due
  occurrence, run_all the oldest (the completion walks the others one by one),
  skip the latest only within the grace; the rest are recorded skipped. When
  run_all's cap leaves occurrences unrun, (last run, latest] becomes the skipped
  range that the completion steps over. When nothing runs, the cursor moves to
  the occurrence after the latest due one.

The overlap policy `allow` (app.core.overlap) is applied last (`_own_lease`): the run
holds a lease of its own instead of the job's, and the cursor moves on past it at
once (`moved_to`), so the next occurrence is claimed at its instant whatever is in
flight. The other policies claim as above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from app.core.misfire import MISFIRE_POLICIES, Occurrence, decide_misfire, find_backlog, is_missed
from app.lifecycle.cursor import advance, following
from app.registry.records import Row, dst_of, schedule_of

RUN_ALL_CAP = 1000


@dataclass(frozen=True)
class ClaimPlan:
    run: Occurrence | None  # the occurrence to start now; None: nothing runs
    attempt: int  # the run's attempt (1-based)
    skipped: tuple[Occurrence, ...] = ()  # recorded as `skipped` runs
    unrecorded_skips: int = 0  # skipped without a row (beyond the cap)
    moved_to: Occurrence | None = None  # when nothing runs: the new cursor (None: the schedule is over)
    skipped_range: tuple[datetime, datetime] | None = None  # new (skipped_after, skipped_through)
    clear_skipped_range: bool = False
    # overlap `allow`: the run holds its own lease and the job moves on to `moved_to` now.
    own_lease: bool = False


def plan_claim(job: Row, now: datetime, grace_s: float) -> ClaimPlan:
    """The claim of one due job: its misfire plan, then its overlap policy."""
    plan = _plan_misfire(job, now, grace_s)
    if plan.run is None or job.get("overlap") != "allow" or job["schedule_kind"] == "once":
        return plan
    return _own_lease(job, plan)


def _own_lease(job: Row, plan: ClaimPlan) -> ClaimPlan:
    """`plan` for a job whose overlap is `allow`: its run holds a lease of its own and
    the job's cursor moves past it now, through the skipped range the plan leaves."""
    assert plan.run is not None
    skipped_after, skipped_through = job.get("skipped_after"), job.get("skipped_through")
    if plan.skipped_range is not None:
        skipped_after, skipped_through = plan.skipped_range
    elif plan.clear_skipped_range:
        skipped_after = skipped_through = None
    moved = advance(
        {**job, "skipped_after": skipped_after, "skipped_through": skipped_through}, plan.run.nominal
    )
    kept = None
    if not moved.clear_skipped_range and skipped_after is not None and skipped_through is not None:
        kept = (skipped_after, skipped_through)
    # For a plan that moves the cursor, the range is the whole value to write.
    return replace(
        plan, own_lease=True, moved_to=moved.next, skipped_range=kept, clear_skipped_range=kept is None
    )


def _plan_misfire(job: Row, now: datetime, grace_s: float) -> ClaimPlan:
    current = Occurrence(job["nominal_at"], job["next_run_at"])
    now = max(now, current.fire_at)  # claimed ahead: planned as at its instant
    if job["misfire_exempt"] or job["schedule_kind"] == "once":
        return ClaimPlan(run=current, attempt=job["attempt"] + 1)
    skipped_after = job.get("skipped_after")
    if job["misfire"] == "run_all" and skipped_after is not None and current.nominal <= skipped_after:
        return ClaimPlan(run=current, attempt=job["attempt"] + 1)
    if _on_time(job, current, now, grace_s):
        # What find_backlog and decide_misfire decide for a backlog of the current
        # occurrence alone, which every policy runs (skip: within the grace).
        return ClaimPlan(
            run=current,
            attempt=job["attempt"] + 1,
            clear_skipped_range=job.get("skipped_through") is not None,
        )

    backlog = find_backlog(
        schedule_of(job), dst_of(job), job["created_at"], job["job_id"], job["jitter_s"], current, now
    )
    decision = decide_misfire(job["misfire"], backlog, now, grace_s, cap=RUN_ALL_CAP)
    latest = backlog.latest or current
    skipped = decision.skipped
    clear = job.get("skipped_through") is not None
    if not decision.run:
        moved = advance(job, latest.nominal)
        return ClaimPlan(
            run=None,
            attempt=0,
            skipped=skipped,
            unrecorded_skips=decision.unrecorded_skips,
            moved_to=moved.next,
            clear_skipped_range=clear,
        )
    run = decision.run[0]
    attempt = job["attempt"] + 1 if run.nominal == current.nominal else 1
    skipped_range = None
    if job["misfire"] == "run_all":
        # The occurrences run_all will run later are not skips; only those beyond the
        # cap are, and they are remembered as a range the completion jumps over.
        last_run = decision.run[-1].nominal
        skipped = tuple(o for o in skipped if o.nominal > last_run)
        if skipped or decision.unrecorded_skips:
            skipped_range = (last_run, latest.nominal)
            clear = False
    return ClaimPlan(
        run=run,
        attempt=attempt,
        skipped=skipped,
        unrecorded_skips=decision.unrecorded_skips,
        skipped_range=skipped_range,
        clear_skipped_range=clear and skipped_range is None,
    )


def _on_time(job: Row, current: Occurrence, now: datetime, grace_s: float) -> bool:
    """True when the current occurrence is the only one due (the job's next one lies
    after `now`) and its policy runs it: the plan of nearly every claim of a recurring
    job, found with one look-up of the next occurrence (app.lifecycle.cursor.following,
    remembered per process) instead of a backlog search."""
    policy = job["misfire"]
    if policy not in MISFIRE_POLICIES or (policy == "skip" and is_missed(current, now, grace_s)):
        return False
    after = following(job, current.nominal)
    return after is None or after > now  # jitter only delays: a later nominal is due later
