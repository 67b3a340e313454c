"""Retries: policy parsing, which answers are retried, backoff bounds, Retry-After in
both forms, the cap, and exhaustion."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import ValidationError
from app.core.retries import (
    RETRY_AFTER_MAX_S,
    CallOutcome,
    RetryDecision,
    RetryPolicy,
    backoff_delay_s,
    decide_retry,
    is_retryable_status,
    parse_retry,
    parse_retry_after,
)
from app.core.timefmt import parse_instant

NOW = parse_instant("2026-06-01T12:00:00Z")  # a Monday
POLICY = RetryPolicy()  # 5 attempts, 10 s, capped at 3600 s


def never(*_):
    raise AssertionError("rand() must not be drawn here")


def fixed(value: float):
    return lambda: value


def delay_of(decision: RetryDecision) -> float:
    return (decision.retry_at - NOW).total_seconds()


# --- parse_retry -------------------------------------------------------------------------


def test_parse_retry_defaults():
    assert parse_retry(None) == RetryPolicy(max_attempts=5, backoff_s=10, max_backoff_s=3600)
    assert parse_retry({}) == RetryPolicy()
    assert parse_retry({"max_attempts": 1}) == RetryPolicy(max_attempts=1)
    assert RetryPolicy().to_json() == {"max_attempts": 5, "backoff_s": 10, "max_backoff_s": 3600}


def test_parse_retry_round_trips():
    policy = parse_retry({"max_attempts": 100, "backoff_s": 0.5, "max_backoff_s": 604800})
    assert policy == RetryPolicy(100, 0.5, 604800)
    assert parse_retry(policy.to_json()) == policy


@pytest.mark.parametrize(
    "data, expected_fields",
    [
        ([], ["retry"]),
        ("5", ["retry"]),
        ({"attempts": 5}, ["retry"]),
        ({"max_attempts": 0}, ["retry.max_attempts"]),
        ({"max_attempts": 101}, ["retry.max_attempts"]),
        ({"max_attempts": 2.5}, ["retry.max_attempts"]),
        ({"max_attempts": "3"}, ["retry.max_attempts"]),
        ({"max_attempts": True}, ["retry.max_attempts"]),
        ({"backoff_s": 0}, ["retry.backoff_s"]),
        ({"backoff_s": -1}, ["retry.backoff_s"]),
        ({"backoff_s": 86_401, "max_backoff_s": 604_800}, ["retry.backoff_s"]),
        ({"backoff_s": float("nan")}, ["retry.backoff_s"]),
        ({"backoff_s": "10"}, ["retry.backoff_s"]),
        ({"max_backoff_s": 604_801}, ["retry.max_backoff_s"]),
        ({"backoff_s": 100, "max_backoff_s": 99}, ["retry.max_backoff_s"]),
        ({"backoff_s": 7200}, ["retry.max_backoff_s"]),  # the default cap 3600 is below it
        (
            {"max_attempts": 0, "backoff_s": 0, "max_backoff_s": -1, "x": 1},
            ["retry", "retry.max_attempts", "retry.backoff_s", "retry.max_backoff_s"],
        ),
    ],
)
def test_parse_retry_errors_name_every_field(data, expected_fields):
    with pytest.raises(ValidationError) as info:
        parse_retry(data)
    assert [e.field for e in info.value.errors] == expected_fields


def test_parse_retry_edges_that_are_allowed():
    assert parse_retry({"backoff_s": 86_400, "max_backoff_s": 86_400}).backoff_s == 86_400
    assert parse_retry({"backoff_s": 5, "max_backoff_s": 5}).max_backoff_s == 5
    assert parse_retry({"max_attempts": 3.0}).max_attempts == 3


# --- which answers are retried -----------------------------------------------------------


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses(status):
    assert is_retryable_status(status)


@pytest.mark.parametrize(
    "status",
    [100, 300, 301, 302, 303, 304, 307, 308, 400, 401, 403, 404, 405, 409, 410, 413, 422, 451, 499, 600],
)
def test_fatal_statuses(status):
    assert not is_retryable_status(status)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_success_is_not_for_decide_retry(status):
    outcome = CallOutcome(status_code=status)
    assert outcome.succeeded
    with pytest.raises(ValueError):
        decide_retry(POLICY, 1, outcome, NOW, never)


def test_queue_publish_without_error_succeeded_and_with_nack_failed():
    assert CallOutcome().succeeded
    assert not CallOutcome(error="publish not confirmed").succeeded
    assert not CallOutcome(status_code=200, error="body unreadable").succeeded


@pytest.mark.parametrize("status", [301, 302, 307, 308, 400, 404, 410, 422])
def test_fatal_status_kills_the_run_at_once_even_on_the_first_attempt(status):
    decision = decide_retry(POLICY, 1, CallOutcome(status_code=status, retry_after="5"), NOW, never)
    assert decision == RetryDecision(retry_at=None, dead=True, reason=f"HTTP {status}: not retried")


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_retryable_status_is_retried(status):
    decision = decide_retry(POLICY, 1, CallOutcome(status_code=status), NOW, fixed(0.0))
    assert decision.retry_at is not None and not decision.dead
    assert decision.reason == f"HTTP {status}"


def test_timeouts_and_connection_errors_are_retried():
    decision = decide_retry(POLICY, 2, CallOutcome(error="timeout after 30s"), NOW, fixed(0.0))
    assert not decision.dead and decision.reason == "timeout after 30s"
    assert delay_of(decision) == 10  # d = 10 * 2**1 = 20, u = 0.5


def test_unfixable_error_is_not_retried():
    outcome = CallOutcome(error="address 10.0.0.7 is private", retryable_error=False)
    decision = decide_retry(POLICY, 1, outcome, NOW, never)
    assert decision == RetryDecision(
        retry_at=None, dead=True, reason="address 10.0.0.7 is private: not retried"
    )


def test_attempt_must_be_one_based():
    with pytest.raises(ValueError):
        decide_retry(POLICY, 0, CallOutcome(status_code=503), NOW, fixed(0.0))


# --- exhaustion ----------------------------------------------------------------------------


def test_attempts_exhausted_on_the_last_attempt():
    # max_attempts counts the first attempt: attempts 1-4 retry, attempt 5 is the last.
    for attempt in range(1, 5):
        assert not decide_retry(POLICY, attempt, CallOutcome(status_code=503), NOW, fixed(0.5)).dead
    decision = decide_retry(POLICY, 5, CallOutcome(status_code=503, retry_after="1"), NOW, never)
    assert decision.dead and decision.retry_at is None
    assert decision.reason == "attempts exhausted (5): HTTP 503"


def test_single_attempt_policy_never_retries():
    decision = decide_retry(
        RetryPolicy(max_attempts=1), 1, CallOutcome(error="connection refused"), NOW, never
    )
    assert decision.dead and decision.reason == "attempts exhausted (1): connection refused"


def test_attempt_beyond_the_budget_is_dead_too():
    # A lease that expired counts as a spent attempt; the janitor may report attempt 6 of 5.
    assert decide_retry(POLICY, 6, CallOutcome(status_code=500), NOW, never).dead


# --- backoff -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attempt, d",
    [(1, 10), (2, 20), (3, 40), (4, 80), (8, 1280), (9, 2560), (10, 3600), (11, 3600), (100, 3600)],
)
def test_backoff_doubles_then_caps(attempt, d):
    assert backoff_delay_s(POLICY, attempt, 1.0) == d
    assert backoff_delay_s(POLICY, attempt, 0.5) == d / 2


def test_backoff_survives_absurd_attempt_numbers():
    assert backoff_delay_s(POLICY, 10_000, 0.75) == 3600 * 0.75


@pytest.mark.parametrize("attempt", range(1, 12))
def test_jitter_bounds_across_attempts(attempt):
    policy = RetryPolicy(max_attempts=100, backoff_s=10, max_backoff_s=3600)
    d = min(3600, 10 * 2 ** (attempt - 1))
    low = delay_of(decide_retry(policy, attempt, CallOutcome(status_code=503), NOW, fixed(0.0)))
    high = delay_of(decide_retry(policy, attempt, CallOutcome(status_code=503), NOW, fixed(0.999999)))
    assert low == pytest.approx(d * 0.5)
    assert d * 0.5 < high < d
    assert high == pytest.approx(d * (0.5 + 0.5 * 0.999999))


def test_rand_is_drawn_once_per_decision():
    draws = []

    def rand():
        draws.append(1)
        return 0.25

    decision = decide_retry(POLICY, 3, CallOutcome(status_code=500), NOW, rand)
    assert draws == [1]
    assert delay_of(decision) == 40 * 0.625


def test_fractional_backoff():
    decision = decide_retry(
        RetryPolicy(backoff_s=0.2, max_backoff_s=1), 1, CallOutcome(status_code=500), NOW, fixed(0.0)
    )
    assert decision.retry_at == NOW + timedelta(milliseconds=100)


# --- Retry-After ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("120", 120.0),
        ("0", 0.0),
        ("  7 ", 7.0),
        ("-5", 0.0),
        ("Mon, 01 Jun 2026 12:02:00 GMT", 120.0),  # IMF-fixdate
        ("Monday, 01-Jun-26 12:00:30 GMT", 30.0),  # obsolete RFC 850 form
        ("Mon Jun  1 12:01:00 2026", 60.0),  # obsolete asctime form
        ("Mon, 01 Jun 2026 11:00:00 GMT", 0.0),  # in the past
        ("Mon, 01 Jun 2026 14:00:00 +0200", 0.0),  # = 12:00Z
    ],
)
def test_parse_retry_after_both_forms(value, seconds):
    assert parse_retry_after(value, NOW) == seconds


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "soon",
        "1.5",
        "12 seconds",
        "Mon, 99 Foo 2026",
        "0x10",
        "\u0661\u0662",  # Arabic-Indic digits: int() reads them, HTTP does not
        "12\n",  # stripped: but "12\nX" is not seconds
        "12\nX",
        "9" * 400,  # over RETRY_AFTER_MAX_CHARS: not read at all
        "9" * 5000,
        "Mon, 01 Jun 99999 12:00:00 GMT",  # year out of range
        "Mon, 01 Jun 2026 12:00:00 +9999",  # offset out of range
        "Mon, 01 Jun 2026 25:00:00 GMT",
        b"120",  # not text
        120,
    ],
)
def test_parse_retry_after_garbage_is_none(value):
    if value == "12\n":  # surrounding whitespace is not part of the value
        assert parse_retry_after(value, NOW) == 12.0
    else:
        assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "value", ["604801", "99999999999999999999", "+" + "9" * 60, "Fri, 31 Dec 9999 23:59:59 GMT"]
)
def test_a_retry_after_beyond_a_week_counts_as_a_week(value):
    assert parse_retry_after(value, NOW) == RETRY_AFTER_MAX_S == 604_800


@settings(max_examples=300, derandomize=True)
@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789+- \t", max_size=80),
        st.from_regex(r"[A-Za-z]{3}, [0-9]{1,3} [A-Za-z]{3} [0-9]{1,6} [0-9:]{1,9} [A-Z+\-0-9]{1,6}"),
    )
)
def test_parse_retry_after_is_total_and_bounded(value):
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or 0.0 <= seconds <= RETRY_AFTER_MAX_S


def test_a_hostile_retry_after_means_the_jobs_own_backoff_or_its_cap():
    huge = CallOutcome(status_code=503, retry_after="9" * 400)
    assert delay_of(decide_retry(POLICY, 1, huge, NOW, fixed(0.0))) == 5.0  # the job's own backoff
    long = CallOutcome(status_code=503, retry_after="9" * 40)
    assert delay_of(decide_retry(POLICY, 1, long, NOW, never)) == 3600  # max_backoff_s


def test_retry_after_seconds_replaces_backoff_without_jitter():
    decision = decide_retry(POLICY, 1, CallOutcome(status_code=429, retry_after="42"), NOW, never)
    assert decision.retry_at == NOW + timedelta(seconds=42) and not decision.dead


def test_retry_after_date_replaces_backoff():
    outcome = CallOutcome(status_code=503, retry_after="Mon, 01 Jun 2026 12:05:00 GMT")
    assert decide_retry(POLICY, 1, outcome, NOW, never).retry_at == parse_instant("2026-06-01T12:05:00Z")


def test_retry_after_is_capped_at_max_backoff():
    outcome = CallOutcome(status_code=503, retry_after="999999")
    assert delay_of(decide_retry(POLICY, 1, outcome, NOW, never)) == 3600
    outcome = CallOutcome(status_code=503, retry_after="Fri, 01 Jan 2027 00:00:00 GMT")
    assert delay_of(decide_retry(POLICY, 1, outcome, NOW, never)) == 3600


def test_retry_after_in_the_past_retries_now():
    outcome = CallOutcome(status_code=503, retry_after="Mon, 01 Jun 2026 00:00:00 GMT")
    assert decide_retry(POLICY, 1, outcome, NOW, never).retry_at == NOW


def test_garbage_retry_after_falls_back_to_backoff():
    decision = decide_retry(POLICY, 1, CallOutcome(status_code=503, retry_after="later"), NOW, fixed(0.0))
    assert delay_of(decision) == 5.0
