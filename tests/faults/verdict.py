"""The verdict of one fault run: what the target saw, checked against the registry.

Pure (no I/O): `judge` takes the calls the sink recorded and the run rows the
registry holds, and says what the guarantee is about:

- lost: a one-off job that was never called, or that is not `completed` at the end;
- duplicates: calls of an occurrence (one Idempotency-Key) after its first one;
  each must be explained by an expired lease: the attempt called before it failed
  "lease expired", and the later call carries a higher attempt. Anything else (the
  same attempt twice, a lower attempt after a higher one) is listed as unexplained;
- recovery: how long after the fault's end the last one-off that had not been called
  yet was first called (`max(first call - max(due, fault end))`, 0 when none waited),
  and the same from the fault's start (a worker killed beside another: its runs
  never called are the other's to call from its death);
  and when the last one-off's outcome was written (a call in flight when its worker
  died is only settled when its lease expires);
- unrecorded and uncalled: the runs settled "lease expired" whose attempt the target
  saw (calls in flight or finished whose outcome the dead worker never wrote), and
  those whose attempt it never saw (started and never called, yet left to their
  lease; or a request written whose connection the dead worker's reset lost before
  the target read it), and how long after the fault's start the last of those had its
  lease taken back (a dead worker's runs never called: within seconds, not a lease);
- recurring: the largest gap between first calls of consecutive occurrences of a
  recurring job, and how its skipped occurrences were explained.

bench.faults prints these figures; tests/faults asserts on them.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

LEASE_EXPIRED = "lease expired"


@dataclass(frozen=True)
class Call:
    """One request the sink received."""

    key: str  # Idempotency-Key: "<job_id>:<scheduled_for>"
    attempt: int
    at: float  # arrival, epoch seconds


@dataclass(frozen=True)
class RunRow:
    """What the verdict needs of a runs row."""

    job_id: str
    scheduled_for: str  # as in the Idempotency-Key (RFC 3339)
    attempt: int
    state: str
    error: str | None
    finished_at: float | None = None  # epoch seconds


@dataclass
class Verdict:
    one_offs: int
    lost: list[str] = field(default_factory=list)  # job ids
    calls: int = 0
    duplicates: int = 0
    unexplained: list[str] = field(default_factory=list)  # one line per unexplained duplicate
    inversions: int = 0  # a lower attempt after a higher one, for one key
    lease_expired: int = 0  # runs settled "lease expired"
    unrecorded: int = 0  # of those, called: their outcome was never written
    uncalled: int = 0  # of those, never called
    uncalled_taken_s: float | None = None  # the last of those taken back, seconds after the fault's start
    last_first_call_s: float | None = None  # the last one-off's first call, seconds after T
    recovery_s: float = 0.0  # see the module docstring
    from_fault_s: float = 0.0  # the same, from the fault's start
    last_settled_s: float | None = None  # the last one-off run's outcome written, seconds after T
    recurring_max_gap_s: float | None = None
    skipped_missed: int = 0
    skipped_superseded: int = 0

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unexplained

    def row(self) -> dict:
        return {
            "lost": len(self.lost),
            "calls": self.calls,
            "duplicates": self.duplicates,
            "unexplained_duplicates": len(self.unexplained),
            "attempt_inversions": self.inversions,
            "lease_expired": self.lease_expired,
            "unrecorded": self.unrecorded,
            "uncalled": self.uncalled,
            "uncalled_taken_s": _rounded(self.uncalled_taken_s),
            "last_one_off_call_s": _rounded(self.last_first_call_s),
            "recovery_s": round(self.recovery_s, 1),
            "from_fault_s": round(self.from_fault_s, 1),
            "last_settled_s": _rounded(self.last_settled_s),
            "recurring_max_gap_s": _rounded(self.recurring_max_gap_s),
            "skipped_missed": self.skipped_missed,
            "skipped_superseded": self.skipped_superseded,
        }

    def summary(self) -> str:
        lines = [f"{key}={value}" for key, value in self.row().items()]
        if self.lost:
            lines.append(f"lost jobs (first 5): {self.lost[:5]}")
        lines.extend(self.unexplained[:10])
        return "; ".join(lines)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def split_key(key: str) -> tuple[str, str]:
    job_id, _, scheduled_for = key.partition(":")
    return job_id, scheduled_for


def judge(
    calls: Iterable[Call],
    runs: Iterable[RunRow],
    one_offs: Mapping[str, float],
    recurring: Iterable[str],
    completed: Iterable[str],
    t0: float,
    fault_end: float | None,
    fault_start: float | None = None,
) -> Verdict:
    """`one_offs`: job id -> due instant (epoch s); `recurring`: job ids; `completed`:
    the one-off job ids that are `completed` at the end; `t0`: T; `fault_end`: when
    the fault was healed (None: no fault); `fault_start`: when it began."""
    by_key: dict[str, list[Call]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.at):
        by_key[call.key].append(call)
    run_rows = list(runs)
    settled = {(r.job_id, r.scheduled_for, r.attempt): r for r in run_rows}
    verdict = Verdict(one_offs=len(one_offs))
    verdict.calls = sum(len(v) for v in by_key.values())
    expired_rows = [r for r in run_rows if (r.error or "").startswith(LEASE_EXPIRED)]
    verdict.lease_expired = len(expired_rows)
    seen_attempts = {(*split_key(key), c.attempt) for key, seen in by_key.items() for c in seen}
    verdict.unrecorded = sum(
        1 for r in expired_rows if (r.job_id, r.scheduled_for, r.attempt) in seen_attempts
    )
    uncalled = [r for r in expired_rows if (r.job_id, r.scheduled_for, r.attempt) not in seen_attempts]
    verdict.uncalled = len(uncalled)
    taken = [r.finished_at for r in uncalled if r.finished_at is not None]
    since = fault_start if fault_start is not None else fault_end
    if taken and since is not None:
        verdict.uncalled_taken_s = max(taken) - since
    verdict.skipped_missed = sum(1 for r in run_rows if r.state == "skipped" and "missed" in (r.error or ""))
    verdict.skipped_superseded = sum(
        1 for r in run_rows if r.state == "skipped" and "superseded" in (r.error or "")
    )

    for key, seen in by_key.items():
        job_id, scheduled_for = split_key(key)
        for before, after in itertools.pairwise(seen):
            verdict.duplicates += 1
            if after.attempt < before.attempt:
                verdict.inversions += 1
                verdict.unexplained.append(f"{key}: attempt {after.attempt} after attempt {before.attempt}")
                continue
            previous = settled.get((job_id, scheduled_for, before.attempt))
            expired = previous is not None and (previous.error or "").startswith(LEASE_EXPIRED)
            if after.attempt == before.attempt or not expired:
                state = "no run row" if previous is None else f"{previous.state} ({previous.error})"
                verdict.unexplained.append(
                    f"{key}: attempt {after.attempt} after attempt {before.attempt}, which was {state}"
                )

    first_call: dict[str, float] = {}
    for key, seen in by_key.items():
        job_id, _ = split_key(key)
        if job_id in one_offs:
            first_call[job_id] = min(first_call.get(job_id, seen[0].at), seen[0].at)
    done = set(completed)
    verdict.lost = sorted(j for j in one_offs if j not in first_call or j not in done)
    if first_call:
        verdict.last_first_call_s = max(first_call.values()) - t0
        end = fault_end if fault_end is not None else t0
        verdict.recovery_s = max(0.0, max(at - max(one_offs[j], end) for j, at in first_call.items()))
        start = fault_start if fault_start is not None else end
        verdict.from_fault_s = max(0.0, max(at - max(one_offs[j], start) for j, at in first_call.items()))

    settled = [r.finished_at for r in run_rows if r.job_id in one_offs and r.finished_at is not None]
    verdict.last_settled_s = max(settled) - t0 if settled else None

    gaps = []
    for job_id in recurring:
        firsts = sorted(seen[0].at for key, seen in by_key.items() if split_key(key)[0] == job_id)
        gaps.extend(b - a for a, b in itertools.pairwise(firsts))
    verdict.recurring_max_gap_s = max(gaps) if gaps else None
    return verdict


def calls_from_headers(received: Sequence) -> list[Call]:
    """tests.sink.Received -> Call (requests without Punctual's headers are ignored)."""
    out = []
    for r in received:
        key, attempt = r.header("Idempotency-Key"), r.header("Punctual-Attempt")
        if key and attempt:
            out.append(Call(key, int(attempt), r.at))
    return out
