"""What a finished attempt changes: a value, decided without I/O.

The completion (a call came back) and the janitor (a lease expired) both settle a
run here and then write the Settlement (app.lifecycle.completion applies it). The rules
are docs/design.md's "Completion of a schedule run" and "Off-schedule runs":

- success: run `succeeded`; the job moves to its next occurrence computed from the
  run's scheduled_for with the job row's current schedule (invariant 6), or is
  `completed` when none remains.
- failure with attempts left (app.core.retries.decide_retry; the registry is the only
  retry layer): run `failed`; a schedule run's job gets next_run_at = retry_at,
  attempt = the run's attempt, misfire_exempt; an off-schedule run gets a new run
  row (attempt + 1, due at retry_at).
- exhausted or fatal: run `dead`; a one-off job becomes `dead`, a recurring one
  moves on as after a success.
- the job's lease is cleared in every case; its state changes only while it is
  `running` (paused stays paused, cancelled stays cancelled, and a cancelled job's
  next_run_at stays null) -- except that an end (`completed`, or a one-off's
  `dead`) also ends a paused job: there is nothing left for a resume to run.
- a job whose overlap is `skip` moves on past what fell due while its run was in
  flight (app.core.overlap): those occurrences are the Settlement's `skipped`.
- a run holding its own lease (off-schedule, or an `allow` job's occurrence) never
  touches the job: its retries are new run rows, as an off-schedule run's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.misfire import Occurrence
from app.core.retries import CallOutcome, RetryPolicy, decide_retry
from app.lifecycle.cursor import CURSOR_COLUMNS, advance, past_the_run

LEASE_EXPIRED = "lease expired"

# The columns of the locked job row that `settle` reads (the cursor's, the state and
# the overlap policy).
JOB_COLUMNS = ("state", "overlap", *CURSOR_COLUMNS)


@dataclass(frozen=True)
class Attempt:
    """The run being settled: what the message and the run row say about it."""

    job_id: Any
    origin: str
    scheduled_for: datetime
    attempt: int
    retry: Mapping[str, Any]
    own_lease: bool = False  # an `allow` job's occurrence: leased on its run row

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            **{k: self.retry[k] for k in ("max_attempts", "backoff_s", "max_backoff_s") if k in self.retry}
        )


@dataclass(frozen=True)
class Settlement:
    run_state: str  # succeeded | failed | dead
    error: str | None
    job: dict | None  # column values for the job row (schedule runs), lease cleared
    retry_at: datetime | None  # an off-schedule retry: a new run row due then
    skipped: tuple[Occurrence, ...] = ()  # due while the run was in flight (overlap skip)
    unrecorded_skips: int = 0  # more of them, beyond those listed

    @property
    def dead(self) -> bool:
        return self.run_state == "dead"


def settle(
    attempt: Attempt,
    outcome: CallOutcome,
    job: Mapping[str, Any] | None,
    now: datetime,
    rand: Callable[[], float],
    retry_now: bool = False,
) -> Settlement:
    """Decide one settled attempt. `job` is the locked job row (schedule runs only);
    `retry_now` (an expired lease) retries at once instead of after a backoff."""
    if outcome.succeeded:
        return _moved_on(job, attempt, "succeeded", None, now)
    decision = decide_retry(attempt.policy, attempt.attempt, outcome, now, rand)
    error = decision.reason
    if decision.dead:
        return _moved_on(job, attempt, "dead", error, now)
    retry_at = now if retry_now else decision.retry_at
    assert retry_at is not None  # decide_retry times every retry that is not dead
    if attempt.origin != "schedule" or attempt.own_lease:
        return Settlement("failed", error, None, retry_at)
    return Settlement("failed", error, _retried(job, attempt, retry_at), None)


def _retried(job: Mapping[str, Any] | None, attempt: Attempt, retry_at: datetime) -> dict | None:
    if job is None:
        return None
    values: dict[str, Any] = {
        "attempt": attempt.attempt,
        "misfire_exempt": True,
        "lease_token": None,
        "leased_until": None,
    }
    if job["state"] != "cancelled":
        values["next_run_at"] = retry_at
    if job["state"] == "running":
        values["state"] = "scheduled"
    return values


def _moved_on(
    job: Mapping[str, Any] | None, attempt: Attempt, run_state: str, error: str | None, now: datetime
) -> Settlement:
    if job is None or attempt.origin != "schedule" or attempt.own_lease:
        return Settlement(run_state, error, None, None)
    values: dict = {"lease_token": None, "leased_until": None, "attempt": 0, "misfire_exempt": False}
    past = None
    if job["schedule_kind"] == "once":
        following = None
    else:
        moved = advance(job, attempt.scheduled_for)
        following = moved.next
        if moved.clear_skipped_range:
            values.update(skipped_after=None, skipped_through=None)
        if job.get("overlap") == "skip" and job["state"] != "cancelled":
            past = past_the_run(job, following, now)
            following = past.next
    skipped = (past.skipped, past.unrecorded) if past is not None else ((), 0)
    if following is None:
        final = "dead" if run_state == "dead" and job["schedule_kind"] == "once" else "completed"
        if job["state"] in ("running", "paused"):
            values["state"] = final
        if job["state"] != "cancelled":
            values["next_run_at"] = None
        return Settlement(run_state, error, values, None, *skipped)
    if job["state"] != "cancelled":
        values.update(next_run_at=following.fire_at, nominal_at=following.nominal)
    if job["state"] == "running":
        values["state"] = "scheduled"
    return Settlement(run_state, error, values, None, *skipped)
