"""The fault tier's verdict (tests/faults/verdict.py): pure, so every rule is checked here."""

from __future__ import annotations

from tests.faults.verdict import Call, RunRow, judge

T = 1000.0
A = "00000000-0000-0000-0000-00000000000a"
B = "00000000-0000-0000-0000-00000000000b"
AT = "2026-11-30T18:00:00Z"


def key(job: str) -> str:
    return f"{job}:{AT}"


def test_each_one_off_called_once_is_clean():
    verdict = judge(
        [Call(key(A), 1, T + 0.5), Call(key(B), 1, T + 1.0)],
        [RunRow(A, AT, 1, "succeeded", None, T + 0.6), RunRow(B, AT, 1, "succeeded", None, T + 1.1)],
        {A: T, B: T},
        [],
        [A, B],
        T,
        None,
    )
    assert verdict.ok and verdict.duplicates == 0 and verdict.lost == []
    assert verdict.last_first_call_s == 1.0 and round(verdict.last_settled_s, 1) == 1.1
    assert verdict.recovery_s == 1.0  # no fault: lateness from T


def test_a_job_never_called_or_not_completed_is_lost():
    verdict = judge([Call(key(A), 1, T + 0.5)], [], {A: T, B: T}, [], [], T, None)
    assert verdict.lost == [A, B]


def test_a_second_call_after_an_expired_lease_is_explained():
    calls = [Call(key(A), 1, T + 1), Call(key(A), 2, T + 30)]
    rows = [RunRow(A, AT, 1, "failed", "lease expired"), RunRow(A, AT, 2, "succeeded", None)]
    verdict = judge(calls, rows, {A: T}, [], [A], T, T + 5)
    assert verdict.ok and verdict.duplicates == 1 and verdict.lease_expired == 1


def test_the_same_attempt_twice_is_not_explained():
    calls = [Call(key(A), 1, T + 1), Call(key(A), 1, T + 2)]
    verdict = judge(calls, [RunRow(A, AT, 1, "succeeded", None)], {A: T}, [], [A], T, None)
    assert not verdict.ok and "attempt 1 after attempt 1" in verdict.unexplained[0]


def test_a_second_call_without_an_expired_lease_is_not_explained():
    calls = [Call(key(A), 1, T + 1), Call(key(A), 2, T + 2)]
    rows = [RunRow(A, AT, 1, "succeeded", None), RunRow(A, AT, 2, "succeeded", None)]
    assert judge(calls, rows, {A: T}, [], [A], T, None).unexplained


def test_a_lower_attempt_after_a_higher_one_is_an_inversion():
    calls = [Call(key(A), 2, T + 30), Call(key(A), 1, T + 31)]
    rows = [RunRow(A, AT, 1, "failed", "lease expired"), RunRow(A, AT, 2, "succeeded", None)]
    verdict = judge(calls, rows, {A: T}, [], [A], T, None)
    assert verdict.inversions == 1 and not verdict.ok


def test_recovery_counts_from_the_fault_end_or_the_due_instant_whichever_is_later():
    calls = [Call(key(A), 1, T + 12), Call(key(B), 1, T + 21)]
    verdict = judge(calls, [], {A: T, B: T + 20}, [], [A, B], T, fault_end=T + 10)
    assert verdict.recovery_s == 2.0  # A waited 2 s after the fault; B was 1 s late on its own


def test_recurring_gaps_and_skip_reasons():
    calls = [Call(f"{B}:2026-11-30T18:00:0{s}Z", 1, T + s) for s in (0, 2, 7)]
    rows = [
        RunRow(B, "2026-11-30T18:00:04Z", 1, "skipped", "superseded by a later occurrence (run_once)"),
        RunRow(B, "2026-11-30T17:00:00Z", 1, "skipped", "missed occurrence (misfire policy run_once)"),
    ]
    verdict = judge(calls, rows, {}, [B], [], T, None)
    assert verdict.recurring_max_gap_s == 5
    assert (verdict.skipped_superseded, verdict.skipped_missed) == (1, 1)


def test_lease_expired_runs_split_into_called_unrecorded_and_never_called():
    calls = [Call(key(A), 1, T + 1), Call(key(A), 2, T + 30), Call(key(B), 2, T + 30)]
    rows = [
        RunRow(A, AT, 1, "failed", "lease expired"),  # called, its outcome never written
        RunRow(A, AT, 2, "succeeded", None),
        RunRow(B, AT, 1, "failed", "lease expired"),  # never called, yet waited out a lease
        RunRow(B, AT, 2, "succeeded", None),
    ]
    verdict = judge(calls, rows, {A: T, B: T}, [], [A, B], T, T + 5)
    assert verdict.lease_expired == 2 and verdict.unrecorded == 1 and verdict.uncalled == 1
    assert verdict.row()["unrecorded"] == 1 and verdict.row()["uncalled"] == 1


def test_runs_never_called_are_timed_from_the_fault_s_start_to_their_lease_taken_back():
    calls = [Call(key(A), 1, T + 1), Call(key(A), 2, T + 30), Call(key(B), 2, T + 6)]
    rows = [
        RunRow(A, AT, 1, "failed", "lease expired", T + 29),  # called: not counted
        RunRow(A, AT, 2, "succeeded", None, T + 30),
        RunRow(B, AT, 1, "failed", "lease expired", T + 5),  # never called: taken back 4 s in
        RunRow(B, AT, 2, "succeeded", None, T + 6),
    ]
    verdict = judge(calls, rows, {A: T, B: T}, [], [A, B], T, T + 7, T + 1)
    assert verdict.uncalled_taken_s == 4.0 and verdict.row()["uncalled_taken_s"] == 4.0
    assert judge(calls[:2], rows[:2], {A: T}, [], [A], T, T + 7, T + 1).uncalled_taken_s is None
