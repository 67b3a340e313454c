"""Cron expressions: what Punctual accepts, and their occurrences in a time zone.

Two halves, both pure:

- `parse_cron` decides which expressions are valid. Punctual accepts standard cron
  only: 5 fields, or 6 with SECONDS FIRST, built from `*`, numbers, `a-b` ranges,
  `*/n` and `a-b/n` steps, comma lists and English month/day names, plus the usual
  `@hourly` ... `@yearly` aliases. croniter accepts more (7 fields with a year,
  `L`, `W`, `#`, `?`, hashed `H`, random `R`, reversed ranges that wrap around);
  those are refused here because other cron implementations read them differently
  or not at all, and a job's expression should mean the same thing everywhere.

- `occurrences` turns an expression and an IANA zone into UTC instants. croniter only
  ever sees NAIVE local wall-clock times: given an aware datetime, croniter 6 and 7
  misfire across DST changes. Each wall-clock time is resolved to UTC here with
  zoneinfo, where PEP 495's `fold` tells a gap (the time does not exist) from an
  overlap (it exists twice), and the job's DST policy decides what runs.
"""

from __future__ import annotations

import copy
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, CroniterError, croniter

GAP_SHIFTED = "gap_shifted"
OVERLAP_FIRST = "overlap_first"
OVERLAP_SECOND = "overlap_second"

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

# (name, low, high, names) for the 6-field order, seconds first; names map to low + index.
_FIELDS = (
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),  # 0 and 7 are both Sunday, as in every cron
)

# Used with fullmatch: `$` would also match before a final newline.
_ITEM = re.compile(r"(?:(\*)|([0-9a-z]+)(?:-([0-9a-z]+))?)(?:/([0-9]+))?")

# The bounds of an expression, checked before croniter sees it: croniter's cost grows
# with a field's items, in its expansion and in every search. No field has more than
# 60 values, so 60 items say all a list can.
MAX_CHARS = 256
MAX_ITEMS = 60

# A reference start for the "does it ever fire" check: a leap year, so that
# "0 0 29 2 *" is found at once; croniter itself looks 50 years ahead.
_PROBE_START = datetime(2000, 1, 1)

# How far past `after` a search for the next occurrence may look before it concludes
# that none remains: a valid expression fires at least every 28 years (Feb 29 on a
# given weekday), and a DST policy of "skip" can only drop some of them.
_HORIZON_YEARS = 100


@dataclass(frozen=True)
class CronExpr:
    """A validated expression: the user's text and the form croniter reads."""

    text: str
    croniter_form: str  # 5 fields, or croniter's 6-field form with seconds LAST

    @property
    def has_seconds(self) -> bool:
        return len(self.croniter_form.split()) == 6


def parse_cron(text: object) -> CronExpr:
    """Validate `text`; raise ValueError with a message fit for a 422 if it is bad."""
    if not isinstance(text, str):
        raise ValueError("must be a string such as '0 0 * * *'")
    if len(text) > MAX_CHARS:
        raise ValueError(f"must be at most {MAX_CHARS} characters")
    return _parse_cron_cached(text)


@lru_cache(maxsize=4096)
def _parse_cron_cached(text: str) -> CronExpr:
    stripped = text.strip()
    if stripped.startswith("@"):
        form = ALIASES.get(stripped.lower())
        if form is None:
            raise ValueError(f"unknown alias {stripped!r}; use one of {', '.join(ALIASES)}")
        return CronExpr(text, form)
    # ASCII whitespace only: croniter's own splitter treats no-break spaces as text too.
    fields = re.split(r"[ \t]+", stripped)
    if len(fields) not in (5, 6):
        raise ValueError(f"must have 5 fields (or 6 with seconds first), not {len(fields)}")
    specs = _FIELDS if len(fields) == 6 else _FIELDS[1:]
    for field, spec in zip(fields, specs, strict=True):
        _check_field(field.lower(), *spec)
    # croniter's 6-field form puts seconds last; Punctual's (and Quartz's) puts them first.
    form = " ".join(fields[1:] + fields[:1]) if len(fields) == 6 else " ".join(fields)
    try:
        probe = croniter(form, _PROBE_START)
    except (CroniterError, ValueError) as exc:
        raise ValueError(f"is not a valid cron expression ({exc})") from None
    try:
        probe.get_next(datetime)
    except (CroniterBadDateError, ValueError):
        raise ValueError("never fires (no date matches it, e.g. February 30)") from None
    return CronExpr(text, form)


def _check_field(field: str, name: str, low: int, high: int, names: tuple[str, ...]) -> None:
    items = field.split(",")
    if len(items) > MAX_ITEMS:
        raise ValueError(f"{name} field: at most {MAX_ITEMS} comma-separated items, not {len(items)}")
    for item in items:
        match = _ITEM.fullmatch(item)
        if not match:
            raise ValueError(f"{name} field: {item!r} is not a number, range, step or '*'")
        star, first, last, step = match.groups()
        if step is not None:
            if not star and last is None:
                # "5/15" is a Quartz-ism; Vixie cron and POSIX need "*/15" or "5-59/15".
                raise ValueError(f"{name} field: a step needs '*' or a range, as in '*/{step}'")
            if int(step) < 1:
                raise ValueError(f"{name} field: step must be at least 1")
        if star:
            continue
        start = _value(first, name, low, high, names)
        if last is not None and _value(last, name, low, high, names) < start:
            # croniter wraps "5-2" around; most crons reject it, so the meaning is unclear.
            raise ValueError(f"{name} field: range {item!r} runs backwards")


def _value(token: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if token.isdigit():
        value = int(token)
        if not low <= value <= high:
            raise ValueError(f"{name} field: {value} is out of range {low}-{high}")
        return value
    if token in names:
        return low + names.index(token)
    raise ValueError(f"{name} field: {token!r} is not a valid value")


# --- wall-clock resolution -------------------------------------------------------


def resolve_local(naive: datetime, zone: ZoneInfo) -> tuple[str, datetime, datetime | None]:
    """Classify a wall-clock time in `zone` and give its UTC instant(s).

    Returns ("regular", t, None), ("overlap", first, second) for a time that occurs
    twice, or ("gap", transition, None) for a time that does not exist, where
    `transition` is the first instant after the gap (where the clock jumped).
    """
    early = naive.replace(tzinfo=zone, fold=0)
    late = naive.replace(tzinfo=zone, fold=1)
    if early.utcoffset() == late.utcoffset():
        return "regular", early.astimezone(UTC), None
    first, second = early.astimezone(UTC), late.astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        # Both folds round-trip: the wall clock showed this time twice.
        return "overlap", min(first, second), max(first, second)
    return "gap", _transition(min(first, second), max(first, second), zone), None


def _transition(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The instant in (before, after] where the zone's UTC offset changes.

    zoneinfo hides its transition table, so bisect on whole seconds: tzdb transitions
    are whole seconds, and a gap is at most a day wide, so this is ~17 probes.
    """
    offset = before.astimezone(zone).utcoffset()
    lo, hi = 0, int((after - before).total_seconds())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (before + timedelta(seconds=mid)).astimezone(zone).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return before + timedelta(seconds=hi)


def occurrences(
    expr: CronExpr, zone: ZoneInfo, gap: str, overlap: str, after: datetime
) -> Iterator[tuple[datetime, str | None]]:
    """Yield (instant in UTC, DST flag) strictly after `after`, increasing, each once.

    gap "shift" runs a non-existent time at the transition instant (occurrences that
    land on the same instant merge into one, flagged gap_shifted); "skip" drops it.
    overlap "once" runs an ambiguous time at its first instant; "twice" at both.
    The flag is None, GAP_SHIFTED, OVERLAP_FIRST or OVERLAP_SECOND (the latter two
    under either overlap policy). Ends when no occurrence remains.
    """
    last: datetime | None = None
    for instant, flag in _raw_occurrences(expr, zone, gap, overlap, after):
        if instant <= after or (last is not None and instant <= last):
            # A duplicate: more gap times shifted onto one instant, or the regular time
            # that instant already is (03:00 after a 02:00-03:00 gap). One run. The
            # shifted one always comes first (a gap precedes the time it lands on), so
            # the instant keeps its gap_shifted flag.
            continue
        yield instant, flag
        last = instant


def _raw_occurrences(
    expr: CronExpr, zone: ZoneInfo, gap: str, overlap: str, after: datetime
) -> Iterator[tuple[datetime, str | None]]:
    """Candidates in non-decreasing UTC order, duplicates allowed; may include <= after.

    Iterating wall-clock times in order yields first instants in order (the earliest
    instant at which the clock reads >= a time can only grow with the time), but the
    second instants of an overlap come after every first instant of that overlap.
    They wait in a heap until the stream passes them.
    """
    start = _iteration_start(after, zone)
    horizon = start.year + _HORIZON_YEARS
    iterator = _iterator(expr.croniter_form, start)
    pending: list[datetime] = []
    while True:
        try:
            naive = iterator.get_next(datetime)
        except (CroniterBadDateError, ValueError):  # no match left, or past year 9999
            break
        if naive.year > horizon:
            break
        kind, first, second = resolve_local(naive, zone)
        if kind == "gap":
            # Every time in this gap resolves to the same transition instant: jump the
            # iterator to the end of the gap instead of walking (a 1 s cron has 3600).
            # (max(): the jump must never go backwards, whatever the zone data says.)
            gap_end = first.astimezone(zone).replace(tzinfo=None)
            iterator = _iterator(expr.croniter_form, max(naive, gap_end - timedelta(seconds=1)))
            if gap == "skip":
                continue
        while pending and pending[0] <= first:
            yield heapq.heappop(pending), OVERLAP_SECOND
        if kind == "regular":
            yield first, None
        elif kind == "gap":
            yield first, GAP_SHIFTED
        else:
            yield first, OVERLAP_FIRST
            if overlap == "twice":
                assert second is not None  # an "overlap" always carries its second instant
                heapq.heappush(pending, second)
    while pending:
        yield heapq.heappop(pending), OVERLAP_SECOND


def _iterator(form: str, start: datetime) -> croniter:
    """A croniter over `form` whose next occurrence is the first strictly after the
    naive wall-clock time `start`.

    croniter expands its expression (splits, ranges, steps, name lookups) every time
    one is built, which costs about as much as finding an occurrence. The expansion
    depends on the expression alone, so each expression is expanded once per process
    (`_expanded`) and a shallow copy of it is started wherever a search begins: a
    search only replaces the copy's own position, never the shared expansion.
    """
    iterator = copy.copy(_expanded(form))
    iterator.set_current(start, force=True)
    return iterator


@lru_cache(maxsize=4096)
def _expanded(form: str) -> croniter:
    return croniter(form, _PROBE_START)


def _iteration_start(after: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time to start croniter from (croniter's next is strict).

    Normally the wall-clock time of `after`. When `after` falls in the first pass of
    an overlap, the second instants of overlap times EARLIER on the wall clock still
    lie ahead of it, so start from the overlap's beginning instead.
    """
    local = after.astimezone(zone)
    naive = local.replace(tzinfo=None, microsecond=0)
    if local.fold == 0:
        kind, first, second = resolve_local(naive, zone)
        if kind == "overlap":
            assert second is not None  # an "overlap" always carries its second instant
            return naive - (second - first)
    return naive
