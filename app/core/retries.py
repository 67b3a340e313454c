"""Retries: the policy, and the decision after a failed attempt.

Retries happen in exactly one layer (docs/design.md invariant 3): the registry writes
`retry_at` into next_run_at. This module only decides; it never sleeps, calls or
writes. The delay before attempt n+1 is d x uniform(0.5, 1.0) with
d = min(max_backoff_s, backoff_s x 2^(n-1)): full exponential growth, "equal jitter"
so that a fleet of jobs failing together does not come back together, and a floor of
d/2 so that a retry is never almost immediate. A Retry-After answer replaces that
(the target said when), capped at max_backoff_s so a hostile header cannot park a
job for a year. Reading it is total: whatever the target sent, the worse case is
that it is ignored and the job's own backoff applies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from app.core.errors import FieldError, ValidationError

MAX_ATTEMPTS = 100
MAX_BACKOFF_S = 86_400
MAX_MAX_BACKOFF_S = 86_400 * 7
# The longest Retry-After read (no HTTP date is half as long): a longer one is
# ignored, as garbage is. Seconds above RETRY_AFTER_MAX_S count as that many.
RETRY_AFTER_MAX_CHARS = 64
RETRY_AFTER_MAX_S = MAX_MAX_BACKOFF_S


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5  # counts the first attempt
    backoff_s: float = 10
    max_backoff_s: float = 3600

    def to_json(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "backoff_s": self.backoff_s,
            "max_backoff_s": self.max_backoff_s,
        }


@dataclass(frozen=True)
class CallOutcome:
    """What one attempt got back from its target."""

    status_code: int | None = None  # HTTP status; None for timeouts, connection errors, publishes
    error: str | None = None  # set when the call failed without a usable status
    retryable_error: bool = True  # False when retrying cannot help (a private address at call time)
    retry_after: str | None = None  # the raw Retry-After header

    @property
    def succeeded(self) -> bool:
        if self.error is not None:
            return False
        # A queue publish has no status: no error means the broker confirmed it.
        return self.status_code is None or 200 <= self.status_code < 300


@dataclass(frozen=True)
class RetryDecision:
    retry_at: datetime | None  # when to try again; None = no retry
    dead: bool  # the run is dead: attempts exhausted, or an answer retrying cannot fix
    reason: str  # for the run's `error`


def parse_retry(data: object, field: str = "retry") -> RetryPolicy:
    """Validate the API form; None or a missing key takes the default."""
    if data is None:
        return RetryPolicy()
    if not isinstance(data, dict):
        raise ValidationError.single(field, 'must be an object such as {"max_attempts": 5}')
    errors: list[FieldError] = []
    unknown = sorted(str(key) for key in data if key not in ("max_attempts", "backoff_s", "max_backoff_s"))
    if unknown:
        errors.append(FieldError(field, f"unknown key(s): {', '.join(unknown)}"))
    defaults = RetryPolicy()
    max_attempts = data.get("max_attempts", defaults.max_attempts)
    backoff_s = data.get("backoff_s", defaults.backoff_s)
    max_backoff_s = data.get("max_backoff_s", defaults.max_backoff_s)

    if isinstance(max_attempts, float) and max_attempts.is_integer():
        max_attempts = int(max_attempts)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS
    ):
        errors.append(FieldError(f"{field}.max_attempts", f"must be an integer from 1 to {MAX_ATTEMPTS}"))
    backoff_ok = _is_number(backoff_s) and 0 < backoff_s <= MAX_BACKOFF_S
    if not backoff_ok:
        errors.append(
            FieldError(f"{field}.backoff_s", f"must be a number of seconds above 0, at most {MAX_BACKOFF_S}")
        )
    if not (_is_number(max_backoff_s) and 0 < max_backoff_s <= MAX_MAX_BACKOFF_S):
        errors.append(
            FieldError(f"{field}.max_backoff_s", f"must be a number of seconds, at most {MAX_MAX_BACKOFF_S}")
        )
    elif backoff_ok and max_backoff_s < backoff_s:
        hint = "" if "max_backoff_s" in data else f" (it defaults to {defaults.max_backoff_s})"
        errors.append(FieldError(f"{field}.max_backoff_s", f"must be at least backoff_s{hint}"))
    if errors:
        raise ValidationError(errors)
    return RetryPolicy(max_attempts=max_attempts, backoff_s=backoff_s, max_backoff_s=max_backoff_s)


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def is_retryable_status(status: int) -> bool:
    """408, 429 and 5xx are worth another try. Everything else that is not 2xx is
    final: a 4xx will not fix itself, and a 3xx is a failure because redirects are
    never followed (a redirect could point a signed call anywhere)."""
    return status in (408, 429) or 500 <= status <= 599


_SECONDS = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also reads "١٢"


def parse_retry_after(value: object, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds or an HTTP-date.

    Total: never raises, whatever the target sent. A negative result (or a date in
    the past) means "now", 0; seconds (or a date) beyond RETRY_AFTER_MAX_S count as
    RETRY_AFTER_MAX_S. Anything else (garbage, a value over RETRY_AFTER_MAX_CHARS,
    not a string) is None, and the caller falls back to its own backoff.
    """
    if not isinstance(value, str) or len(value) > RETRY_AFTER_MAX_CHARS:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        # Compared as text first: int() of a long digit string is slow, and float() of a
        # large one overflows.
        digits = text.lstrip("+-").lstrip("0")
        if text.startswith("-"):
            return 0.0
        if len(digits) > len(str(RETRY_AFTER_MAX_S)):
            return float(RETRY_AFTER_MAX_S)
        return float(min(RETRY_AFTER_MAX_S, int(digits or "0")))
    try:
        when = parsedate_to_datetime(text)
        if when.tzinfo is None:  # "-0000" parses naive; HTTP dates are GMT anyway
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    except Exception:  # the email parser raises several kinds for malformed dates
        return None
    return min(float(RETRY_AFTER_MAX_S), max(0.0, seconds))


def backoff_delay_s(policy: RetryPolicy, attempt: int, u: float) -> float:
    """The delay after failed attempt `attempt` (1-based), given u in [0.5, 1.0)."""
    # Bound the exponent only so an absurd attempt number cannot overflow a float;
    # max_attempts <= 100 keeps real ones far below it.
    exponent = min(attempt - 1, 1000)
    return min(policy.max_backoff_s, policy.backoff_s * 2.0**exponent) * u


def decide_retry(
    policy: RetryPolicy, attempt: int, outcome: CallOutcome, now: datetime, rand: Callable[[], float]
) -> RetryDecision:
    """Decide what follows failed attempt `attempt` (1-based).

    `rand()` returns uniform [0, 1); it is injected so tests can pin the jitter.
    """
    if outcome.succeeded:
        raise ValueError("decide_retry is for failed attempts; this one succeeded")
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if outcome.error is not None:
        cause, retryable = outcome.error, outcome.retryable_error
    else:
        # Not succeeded and no error: only a non-2xx status is left.
        assert outcome.status_code is not None
        cause, retryable = f"HTTP {outcome.status_code}", is_retryable_status(outcome.status_code)
    if not retryable:
        return RetryDecision(retry_at=None, dead=True, reason=f"{cause}: not retried")
    if attempt >= policy.max_attempts:
        return RetryDecision(
            retry_at=None, dead=True, reason=f"attempts exhausted ({policy.max_attempts}): {cause}"
        )
    delay_s = parse_retry_after(outcome.retry_after, now)
    if delay_s is not None:
        delay_s = min(delay_s, policy.max_backoff_s)
    else:
        delay_s = backoff_delay_s(policy, attempt, 0.5 + 0.5 * rand())
    return RetryDecision(retry_at=now + timedelta(seconds=delay_s), dead=False, reason=cause)
