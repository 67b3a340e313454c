"""Overlap: what a recurring job does with an occurrence that falls due while a run
of it is in flight (docs/api.md "Overlap"). Pure: the policies, their parser, the
reason a skipped occurrence records.

- buffer_one (the default, and what Punctual did before the policy existed): the job
  holds one lease, so the occurrence waits for the run in flight; when that run ends
  the job moves on from the run's own occurrence, and what fell due meanwhile is a
  backlog the next claim settles by the misfire policy (run_once: the latest runs at
  once and the others are skipped; run_all: each runs in turn; skip: the latest runs
  only within the grace).
- skip: what falls due while a run is in flight is recorded `skipped` (IN_FLIGHT)
  when the run ends, and the job moves on to its first occurrence after that
  (app.lifecycle.cursor `past_the_run`).
- allow: every occurrence starts on time, whatever is in flight: its run holds a
  lease of its own, on the run row as a triggered run's does, and the claim moves the
  job on at once (app.pollers.plan), so runs of one job go side by side.

A one-off has one occurrence: the policy changes nothing for it.
"""

from __future__ import annotations

OVERLAP_POLICIES = ("buffer_one", "skip", "allow")
DEFAULT_OVERLAP = "buffer_one"
IN_FLIGHT = "a run of the job was in flight (overlap skip)"


def parse_overlap(value: object) -> str:
    """The API's `overlap` field; None takes the default. Raises ValueError for a 422."""
    if value is None:
        return DEFAULT_OVERLAP
    if value not in OVERLAP_POLICIES:
        raise ValueError(f"must be one of {', '.join(OVERLAP_POLICIES)}")
    assert isinstance(value, str)
    return value
