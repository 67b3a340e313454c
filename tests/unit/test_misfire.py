"""Misfires: finding the backlog fast, and every policy x grace x backlog size."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

import pytest

import app.core.jitter
from app.core.misfire import (
    MISFIRE_POLICIES,
    Backlog,
    MisfireDecision,
    Occurrence,
    decide_misfire,
    find_backlog,
    is_missed,
    parse_misfire,
    skip_reason,
)
from app.core.schedules import DstPolicy, Schedule
from app.core.timefmt import parse_instant

JOB = uuid.UUID("00000000-0000-4000-8000-000000000042")
DST = DstPolicy()
GRACE_S = 60
START = parse_instant("2026-06-01T00:00:00Z")
# Hourly, so that being a minute or two late never makes another occurrence due.
HOURLY = Schedule(kind="interval", interval_s=3600, start_at=START)


def Z(text: str) -> datetime:
    return parse_instant(text)


def at(k: int) -> datetime:
    """The k-th occurrence (0-based) of HOURLY."""
    return START + timedelta(hours=k)


def occ(k: int) -> Occurrence:
    return Occurrence(at(k), at(k))


def backlog_of(
    schedule: Schedule, now: datetime, *, jitter_s: int = 0, first: Occurrence | None = None, anchor=START
) -> Backlog:
    if first is None:
        first = Occurrence(START, app.core.jitter.fire_at(JOB, START, jitter_s))
    return find_backlog(schedule, DST, anchor, JOB, jitter_s, first, now)


# --- find_backlog --------------------------------------------------------------------------


def test_nothing_due_yet():
    assert backlog_of(HOURLY, at(0) - timedelta(microseconds=1)) == Backlog((), None, False, 0)


def test_exactly_due_is_due():
    assert backlog_of(HOURLY, at(0)) == Backlog((occ(0),), occ(0), False, 1)


def test_three_due():
    assert backlog_of(HOURLY, at(2) + timedelta(minutes=59)) == Backlog(
        (occ(0), occ(1), occ(2)), occ(2), False, 3
    )


def test_limit_truncates_and_latest_lies_beyond():
    backlog = backlog_of(HOURLY, at(1499))
    assert backlog.oldest == tuple(occ(k) for k in range(1001))
    assert backlog.latest == occ(1499)
    assert backlog.truncated and backlog.count == 1500


def test_limit_plus_one_is_not_truncated():
    # 1002 due, 1001 listed: the only one not listed is `latest` itself.
    backlog = backlog_of(HOURLY, at(1001))
    assert len(backlog.oldest) == 1001 and backlog.latest == occ(1001)
    assert not backlog.truncated and backlog.count == 1002


def test_end_at_bounds_the_backlog():
    bounded = Schedule(kind="interval", interval_s=3600, start_at=START, end_at=at(4))
    backlog = backlog_of(bounded, at(100))
    assert (
        backlog.oldest == tuple(occ(k) for k in range(5)) and backlog.latest == occ(4) and backlog.count == 5
    )


def test_one_off_backlog_is_its_run_at():
    once = Schedule(kind="once", run_at=START)
    assert backlog_of(once, at(1000)) == Backlog((occ(0),), occ(0), False, 1)


def test_first_occurrence_keeps_its_own_fire_at():
    # A held run's next_run_at may be later than its jittered instant; use the given one.
    held = Occurrence(at(0), at(0) + timedelta(seconds=35))
    assert backlog_of(HOURLY, at(0) + timedelta(seconds=30), first=held) == Backlog((), None, False, 0)
    backlog = backlog_of(HOURLY, at(0) + timedelta(seconds=35), first=held)
    assert backlog == Backlog((held,), held, False, 1)


def test_jitter_decides_what_is_due():
    # With jitter, an occurrence is due at nominal + its own offset.
    jitter_s = 3600
    schedule = Schedule(kind="interval", interval_s=7200, start_at=START)
    offsets = [app.core.jitter.jitter_offset(JOB, START + timedelta(hours=2 * k), jitter_s) for k in range(3)]
    fire = [START + timedelta(hours=2 * k) + offsets[k] for k in range(3)]
    just_before = backlog_of(schedule, fire[1] - timedelta(milliseconds=1), jitter_s=jitter_s)
    assert [o.fire_at for o in just_before.oldest] == fire[:1]
    at_second = backlog_of(schedule, fire[1], jitter_s=jitter_s)
    assert [o.fire_at for o in at_second.oldest] == fire[:2] and at_second.latest.fire_at == fire[1]


def test_overtaken_occurrence_stays_in_the_backlog():
    # 1 s interval, jitter up to 60 s: occurrences overtake each other. Whatever lies
    # between first and latest is in the backlog, so the cursor never skips one silently.
    schedule = Schedule(kind="interval", interval_s=1, start_at=START)
    now = START + timedelta(seconds=90)
    backlog = backlog_of(schedule, now, jitter_s=60)
    nominals = [o.nominal for o in backlog.oldest]
    assert nominals == [START + timedelta(seconds=k) for k in range(len(nominals))]
    assert backlog.latest == backlog.oldest[-1] and backlog.latest.fire_at <= now
    later = [START + timedelta(seconds=k) for k in range(len(nominals), 91)]
    assert all(app.core.jitter.fire_at(JOB, t, 60) > now for t in later)  # nothing later is due
    assert backlog.count == len(nominals)


def test_cron_backlog_across_the_spring_gap_is_the_deduplicated_stream():
    # Berlin every 15 min: 00:45Z, 01:00Z (02:00-02:45 shifted onto 03:00 CEST), 01:15Z.
    schedule = Schedule(kind="cron", cron="*/15 * * * *", timezone="Europe/Berlin")
    first = Occurrence(Z("2026-03-29T00:45:00Z"), Z("2026-03-29T00:45:00Z"))
    backlog = find_backlog(schedule, DST, START, JOB, 0, first, Z("2026-03-29T01:20:00Z"))
    assert [o.nominal for o in backlog.oldest] == [
        Z("2026-03-29T00:45:00Z"),
        Z("2026-03-29T01:00:00Z"),
        Z("2026-03-29T01:15:00Z"),
    ]
    assert backlog.count == 3 and not backlog.truncated


def test_huge_cron_backlog_count_is_unknown_but_bounded_work():
    schedule = Schedule(kind="cron", cron="* * * * * *")
    first = Occurrence(START, START)
    backlog = find_backlog(schedule, DST, START, JOB, 0, first, START + timedelta(hours=2))
    assert backlog.truncated and backlog.count is None
    assert backlog.latest == Occurrence(START + timedelta(hours=2), START + timedelta(hours=2))


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(kind="interval", interval_s=1),
        Schedule(kind="cron", cron="* * * * * *", timezone="Europe/Berlin"),
    ],
    ids=["interval", "cron"],
)
@pytest.mark.parametrize("jitter_s", [0, 30])
def test_week_down_one_second_job_does_not_enumerate(schedule, jitter_s, monkeypatch):
    # 604,800 occurrences are due. Enumerating them would take ~10 s and 600k jitter
    # hashes; find_backlog must touch only `limit` of them plus the jitter window.
    real_fire_at, calls = app.core.jitter.fire_at, []

    def counting_fire_at(*args):
        calls.append(1)
        return real_fire_at(*args)

    monkeypatch.setattr(app.core.jitter, "fire_at", counting_fire_at)
    created = Z("2026-03-25T00:00:00Z")
    first_nominal = created + timedelta(seconds=1)
    first = Occurrence(first_nominal, real_fire_at(JOB, first_nominal, jitter_s))
    now = created + timedelta(days=7, milliseconds=500)
    started = time.perf_counter()
    backlog = find_backlog(schedule, DST, created, JOB, jitter_s, first, now)
    elapsed = time.perf_counter() - started
    assert len(backlog.oldest) == 1001 and backlog.truncated
    assert now - timedelta(seconds=jitter_s + 1) <= backlog.latest.nominal <= now
    assert backlog.latest.fire_at <= now
    assert len(calls) <= 1001 + 2 * jitter_s + 5
    assert elapsed < 2.0
    if schedule.kind == "interval":
        assert backlog.count == (backlog.latest.nominal - first_nominal) // timedelta(seconds=1) + 1


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        find_backlog(HOURLY, DST, START, JOB, 0, occ(0), at(5), limit=0)


# --- decide_misfire: every policy x within/beyond grace x 0/1/3/1500 due -----------------

WITHIN, BEYOND = timedelta(seconds=5), timedelta(seconds=GRACE_S + 60)


def case(due: int, lateness: timedelta) -> tuple[Backlog, datetime]:
    now = at(due - 1) + lateness if due else at(0) - timedelta(seconds=1)
    return backlog_of(HOURLY, now), now


def ks(occurrences) -> list[int]:
    return [(o.nominal - START) // timedelta(hours=1) for o in occurrences]


# (policy, due, lateness) -> (run, skipped, unrecorded_skips), occurrence indexes.
EXPECTED = {
    # Nothing due: nothing to do, whatever the policy.
    **{(p, 0, g): ([], [], 0) for p in MISFIRE_POLICIES for g in ("within", "beyond")},
    # One due within the grace: it runs, whatever the policy.
    **{(p, 1, "within"): ([0], [], 0) for p in MISFIRE_POLICIES},
    ("run_once", 1, "beyond"): ([0], [], 0),
    ("run_all", 1, "beyond"): ([0], [], 0),
    ("skip", 1, "beyond"): ([], [0], 0),
    ("run_once", 3, "within"): ([2], [0, 1], 0),
    ("run_all", 3, "within"): ([0, 1, 2], [], 0),
    ("skip", 3, "within"): ([2], [0, 1], 0),
    ("run_once", 3, "beyond"): ([2], [0, 1], 0),
    ("run_all", 3, "beyond"): ([0, 1, 2], [], 0),
    ("skip", 3, "beyond"): ([], [0, 1, 2], 0),
    # 1500 due; 1001 listed (0-1000) plus latest (1499). At most 1000 skips recorded.
    ("run_once", 1500, "within"): ([1499], list(range(1000)), 499),
    ("run_all", 1500, "within"): (list(range(1000)), [1000, 1499], 498),
    ("skip", 1500, "within"): ([1499], list(range(1000)), 499),
    ("run_once", 1500, "beyond"): ([1499], list(range(1000)), 499),
    ("run_all", 1500, "beyond"): (list(range(1000)), [1000, 1499], 498),
    ("skip", 1500, "beyond"): ([], list(range(999)) + [1499], 500),
}


@pytest.mark.parametrize("policy", MISFIRE_POLICIES)
@pytest.mark.parametrize("due", [0, 1, 3, 1500])
@pytest.mark.parametrize("grace", ["within", "beyond"])
def test_policy_matrix(policy, due, grace):
    backlog, now = case(due, WITHIN if grace == "within" else BEYOND)
    decision = decide_misfire(policy, backlog, now, GRACE_S)
    run, skipped, unrecorded = EXPECTED[(policy, due, grace)]
    assert (ks(decision.run), ks(decision.skipped), decision.unrecorded_skips) == (run, skipped, unrecorded)
    # Every due occurrence is accounted for exactly once.
    assert len(decision.run) + len(decision.skipped) + decision.unrecorded_skips == due
    assert not {o.nominal for o in decision.run} & {o.nominal for o in decision.skipped}


def test_grace_boundary_is_inclusive():
    # Missed only when MORE than the grace late.
    backlog, now = case(1, timedelta(seconds=GRACE_S))
    assert ks(decide_misfire("skip", backlog, now, GRACE_S).run) == [0]
    backlog, now = case(1, timedelta(seconds=GRACE_S, microseconds=1))
    assert ks(decide_misfire("skip", backlog, now, GRACE_S).run) == []
    assert is_missed(occ(0), at(0) + timedelta(seconds=GRACE_S, microseconds=1), GRACE_S)
    assert not is_missed(occ(0), at(0) + timedelta(seconds=GRACE_S), GRACE_S)


def test_grace_counts_from_the_jittered_fire_at():
    jittered = Occurrence(at(0), at(0) + timedelta(seconds=50))
    backlog = Backlog((jittered,), jittered, False, 1)
    now = at(0) + timedelta(seconds=100)  # 100 s after nominal, 50 s after fire_at
    assert decide_misfire("skip", backlog, now, GRACE_S).run == (jittered,)


def test_run_all_cap_with_a_smaller_cap():
    backlog, now = case(3, BEYOND)
    decision = decide_misfire("run_all", backlog, now, GRACE_S, cap=2)
    assert (ks(decision.run), ks(decision.skipped), decision.unrecorded_skips) == ([0, 1], [2], 0)


def test_unknown_count_gives_a_lower_bound():
    # A truncated cron backlog: the count is unknown, the skips beyond the listed ones
    # are at least one.
    backlog = Backlog(oldest=tuple(occ(k) for k in range(5)), latest=occ(9), truncated=True, count=None)
    decision = decide_misfire("run_once", backlog, at(9), GRACE_S, cap=3)
    assert ks(decision.run) == [9] and ks(decision.skipped) == [0, 1, 2]
    assert decision.unrecorded_skips == 3  # 4, and at least one between 4 and 9


def test_unknown_policy_is_a_bug():
    with pytest.raises(ValueError):
        decide_misfire("run_twice", case(1, WITHIN)[0], at(0), GRACE_S)


def test_decision_is_a_value():
    decision = decide_misfire("run_once", *case(3, WITHIN), GRACE_S)
    assert isinstance(decision, MisfireDecision)
    with pytest.raises(AttributeError):
        decision.run = ()  # frozen


def test_parse_misfire():
    assert parse_misfire(None) == "run_once"
    assert [parse_misfire(p) for p in MISFIRE_POLICIES] == list(MISFIRE_POLICIES)
    for bad in ("RUN_ONCE", "never", 1, ["skip"]):
        with pytest.raises(ValueError):
            parse_misfire(bad)


def test_run_all_never_runs_past_a_hole_in_a_truncated_backlog():
    # Only `oldest` is contiguous: running `latest` too would run 9 before 5-8.
    backlog = Backlog(oldest=tuple(occ(k) for k in range(5)), latest=occ(9), truncated=True, count=10)
    decision = decide_misfire("run_all", backlog, at(9), GRACE_S, cap=1000)
    assert (ks(decision.run), ks(decision.skipped), decision.unrecorded_skips) == ([0, 1, 2, 3, 4], [9], 4)


# -- skip reasons: the recorded error says why an occurrence did not run -------------------


def test_an_occurrence_inside_the_grace_was_superseded_not_missed():
    two_s_job = Occurrence(Z("2026-06-01T00:00:02Z"), Z("2026-06-01T00:00:02Z"))
    now = Z("2026-06-01T00:00:12Z")  # claimed 10 s late, behind a burst: inside the 60 s grace
    assert skip_reason("run_once", two_s_job, now, GRACE_S) == "superseded by a later occurrence (run_once)"
    assert skip_reason("skip", two_s_job, now, GRACE_S) == "superseded by a later occurrence (skip)"


def test_an_occurrence_past_the_grace_was_missed():
    old = Occurrence(at(0), at(0))
    assert skip_reason("run_once", old, at(0) + timedelta(seconds=GRACE_S + 1), GRACE_S) == (
        "missed occurrence (misfire policy run_once)"
    )
    # Exactly at the grace is still on time (is_missed is strictly after it).
    assert skip_reason("run_once", old, at(0) + timedelta(seconds=GRACE_S), GRACE_S).startswith("superseded")


def test_run_all_skips_only_beyond_its_cap_which_is_a_miss():
    reason = skip_reason("run_all", Occurrence(at(0), at(0)), at(0), GRACE_S)
    assert reason == "missed occurrence (misfire policy run_all)"
