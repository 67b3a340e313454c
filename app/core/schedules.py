"""Schedules: when a job fires. Parsing the API form, and every fire-time question.

All functions are pure: `now`/`after` are arguments, every instant in or out is an
aware UTC datetime. A job's occurrences t always satisfy start_at <= t <= end_at.

- once: `run_at`.
- cron: the expression's wall-clock times in `timezone`, resolved through the job's
  DST policy (app/core/cron.py does the resolution).
- interval: a fixed grid, start_at + k*interval_s (k >= 0); without start_at the grid
  starts at the job's creation (`anchor`) and its first point is one interval later.
  Intervals are absolute durations: DST never moves them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from app.core import cron
from app.core.errors import FieldError, ValidationError
from app.core.timefmt import format_instant, parse_instant

KINDS = ("once", "cron", "interval")
GAP_POLICIES = ("shift", "skip")
OVERLAP_POLICIES = ("once", "twice")
MAX_INTERVAL_S = 31_536_000  # one (non-leap) year

_KIND_KEYS = {"run_at": "once", "cron": "cron", "interval_s": "interval"}
_OPTIONAL_KEYS = {"timezone": ("cron",), "start_at": ("cron", "interval"), "end_at": ("cron", "interval")}
_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class DstPolicy:
    """What a cron job does with wall-clock times a DST change removes or repeats."""

    gap: str = "shift"  # "shift": run at the transition instant | "skip"
    overlap: str = "once"  # "once": the first of the two instants | "twice": both

    def to_json(self) -> dict[str, str]:
        return {"gap": self.gap, "overlap": self.overlap}


@dataclass(frozen=True)
class Schedule:
    kind: str  # "once" | "cron" | "interval"
    run_at: datetime | None = None
    cron: str | None = None
    timezone: str = "UTC"
    interval_s: int | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The API form; parse_schedule(s.to_json()) == s."""
        if self.kind == "once":
            return {"run_at": format_instant(_run_at(self))}
        data: dict[str, Any] = (
            {"cron": self.cron, "timezone": self.timezone}
            if self.kind == "cron"
            else {"interval_s": self.interval_s}
        )
        if self.start_at is not None:
            data["start_at"] = format_instant(self.start_at)
        if self.end_at is not None:
            data["end_at"] = format_instant(self.end_at)
        return data

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")  # a row may hold NULL for non-cron kinds


@dataclass(frozen=True)
class PreviewItem:
    at: datetime  # UTC
    local: datetime  # aware, in the schedule's zone
    dst: str | None  # None | "gap_shifted" | "overlap_first" | "overlap_second"


# --- parsing -------------------------------------------------------------------------


def parse_schedule(data: object, field: str = "schedule") -> Schedule:
    """Validate the API form of a schedule; every bad sub-field is reported at once.

    A null sub-field counts as absent (PATCH replaces a schedule whole, and a client
    that writes `"end_at": null` means "no end").
    """
    if not isinstance(data, dict):
        raise ValidationError.single(field, "must be an object with one of run_at, cron, interval_s")
    errors: list[FieldError] = []
    present = {key: value for key, value in data.items() if value is not None}
    unknown = sorted(str(key) for key in present if key not in _KIND_KEYS and key not in _OPTIONAL_KEYS)
    if unknown:
        errors.append(FieldError(field, f"unknown key(s): {', '.join(unknown)}"))
    kinds = [_KIND_KEYS[key] for key in _KIND_KEYS if key in present]
    if len(kinds) != 1:
        errors.append(FieldError(field, "must have exactly one of run_at, cron, interval_s"))
    kind = kinds[0] if len(kinds) == 1 else None
    if kind is not None:
        for key, kinds_allowed in _OPTIONAL_KEYS.items():
            if key in present and kind not in kinds_allowed:
                errors.append(FieldError(f"{field}.{key}", f"is not allowed in a {kind} schedule"))

    values: dict[str, Any] = {}

    def check(key: str, parse: Callable[[Any], object]) -> None:
        if key in present:
            try:
                values[key] = parse(present[key])
            except ValueError as exc:
                errors.append(FieldError(f"{field}.{key}", str(exc)))

    check("run_at", parse_instant)
    check("cron", lambda text: cron.parse_cron(text).text)
    check("timezone", parse_timezone)
    check("interval_s", _parse_interval_s)
    check("start_at", parse_instant)
    check("end_at", parse_instant)
    start_at, end_at = values.get("start_at"), values.get("end_at")
    if start_at is not None and end_at is not None and end_at <= start_at:
        errors.append(FieldError(f"{field}.end_at", "must be after start_at"))
    if errors:  # always the case when kind is None
        raise ValidationError(errors)
    assert kind is not None
    return Schedule(kind=kind, **values)


def parse_dst(data: object, field: str = "dst") -> DstPolicy:
    """Validate the API form of a DST policy; None (or a missing key) takes defaults."""
    if data is None:
        return DstPolicy()
    if not isinstance(data, dict):
        raise ValidationError.single(field, 'must be an object such as {"gap": "shift", "overlap": "once"}')
    errors: list[FieldError] = []
    unknown = sorted(str(key) for key in data if key not in ("gap", "overlap"))
    if unknown:
        errors.append(FieldError(field, f"unknown key(s): {', '.join(unknown)}"))
    gap = data.get("gap")
    if gap is None:
        gap = "shift"
    overlap = data.get("overlap")
    if overlap is None:
        overlap = "once"
    if gap not in GAP_POLICIES:
        errors.append(FieldError(f"{field}.gap", "must be 'shift' or 'skip'"))
    if overlap not in OVERLAP_POLICIES:
        errors.append(FieldError(f"{field}.overlap", "must be 'once' or 'twice'"))
    if errors:
        raise ValidationError(errors)
    return DstPolicy(gap=gap, overlap=overlap)


def parse_timezone(value: object) -> str:
    """An IANA zone id known to zoneinfo; raises ValueError otherwise."""
    if not isinstance(value, str) or value not in _zone_ids():
        raise ValueError("must be an IANA time zone id such as 'Europe/Berlin'")
    return value


@lru_cache(maxsize=1)
def _zone_ids() -> frozenset[str]:
    # "localtime" is the host's own zone file, not an IANA id: a job must not depend
    # on which machine parsed it.
    return frozenset(available_timezones() - {"localtime", "posixrules"})


def _parse_interval_s(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be an integer number of seconds, 1 to {MAX_INTERVAL_S}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("must be a whole number of seconds")
    if not 1 <= value <= MAX_INTERVAL_S:
        raise ValueError(f"must be between 1 and {MAX_INTERVAL_S} seconds")
    return int(value)


# --- fire times ----------------------------------------------------------------------


def next_fire(schedule: Schedule, dst: DstPolicy, after: datetime, anchor: datetime) -> datetime | None:
    """The first occurrence strictly after `after`; None when none remains.

    `anchor` is the job's created_at: the interval grid's origin when there is no
    start_at. Bounds: start_at <= t <= end_at.
    """
    if schedule.kind != "cron":
        return next(iter_fires(schedule, dst, after, anchor), None)
    _refuse_naive(after, anchor)
    return next_cron_fire(
        schedule.cron, schedule.timezone, schedule.start_at, schedule.end_at, dst.gap, dst.overlap, after
    )


# A cron occurrence depends on the expression, the zone, the bounds, the DST policy and
# `after` alone (never on the job or the anchor), so it is remembered, bounded, per
# process. The jobs that fire at one instant mostly share their expression and zone
# ("0 0 * * *" in a few zones at midnight): the claim, which plans each run from its
# occurrence, and the completion, which moves each job to its next one, then compute
# each distinct next occurrence once, not two or three times per run. The key is the
# plain values (strings and instants, hashed in C), so that a row's columns look it
# up without building a Schedule or a DstPolicy (app.lifecycle.cursor); the zone and
# both DST policies are in it, so two zones or two policies never share an answer.
@lru_cache(maxsize=4096)
def next_cron_fire(
    text: str | None,
    timezone: str | None,
    start_at: datetime | None,
    end_at: datetime | None,
    gap: str,
    overlap: str,
    after: datetime,
) -> datetime | None:
    """next_fire of a cron schedule given as its columns; `after` must be aware."""
    _refuse_naive(after)
    schedule = Schedule(kind="cron", cron=text, timezone=timezone or "UTC", start_at=start_at, end_at=end_at)
    dst = DstPolicy(gap=gap, overlap=overlap)
    return next((at for at, _flag in _flagged(schedule, dst, after, after)), None)


def first_fire(schedule: Schedule, dst: DstPolicy, now: datetime, anchor: datetime) -> datetime | None:
    """The first occurrence of a job created (or re-scheduled) at `now`.

    A one-off keeps its run_at even when that is past: it fires at once. Recurring
    schedules give the first occurrence >= start_at and > now (next_fire's bounds).
    """
    if schedule.kind == "once":
        return schedule.run_at
    return next_fire(schedule, dst, now, anchor)


def iter_fires(schedule: Schedule, dst: DstPolicy, after: datetime, anchor: datetime) -> Iterator[datetime]:
    """Every occurrence strictly after `after`, increasing, within the bounds."""
    if schedule.kind == "cron":
        # The first is next_fire's (remembered); the others are those after the first.
        first = next_fire(schedule, dst, after, anchor)
        if first is None:
            return
        yield first
        after = first
    for at, _flag in _flagged(schedule, dst, after, anchor):
        yield at


def preview(schedule: Schedule, dst: DstPolicy, after: datetime, count: int) -> list[PreviewItem]:
    """The next `count` occurrences after `after`, with local times and DST flags.

    gap_shifted marks an instant a gap moved (also when it coincides with one the
    schedule has anyway: it is listed once); overlap_first/overlap_second mark an
    instant whose local wall-clock time occurs twice, under either overlap policy.
    For intervals the grid is after + k*interval_s (k >= 1), or start_at's grid.
    """
    zone = schedule.zone
    return [
        PreviewItem(at=at, local=at.astimezone(zone), dst=flag)
        for at, flag in islice(_flagged(schedule, dst, after, after), count)
    ]


def latest_fire(
    schedule: Schedule, dst: DstPolicy, anchor: datetime, since: datetime, until: datetime
) -> datetime | None:
    """The latest occurrence t with since < t <= until, without walking them all.

    Intervals are arithmetic. For cron, "some occurrence lies in (a, until]" is one
    next_fire(a) call and is monotone in a, so widen a window back from `until`
    until it holds, then bisect to the microsecond: ~60 probes for a week-long window
    of a 1-second cron, instead of 600,000 steps.
    """
    if until <= since:
        return None
    if schedule.kind == "interval":
        if schedule.end_at is not None:
            until = min(until, schedule.end_at)
        origin, k_min = _grid(schedule, anchor)
        step = _step(schedule)
        k = (until - origin) // step
        at = origin + k * step
        return at if k >= k_min and at > since else None

    def some_in(a: datetime) -> bool:
        found = next_fire(schedule, dst, a, anchor)
        return found is not None and found <= until

    if not some_in(since):
        return None
    good, bad, width = since, until, timedelta(seconds=1)
    while until - width > since:
        if some_in(until - width):
            good = until - width
            break
        bad, width = until - width, width * 2
    while bad - good > _ONE_MICROSECOND:
        mid = good + (bad - good) / 2
        if some_in(mid):
            good = mid
        else:
            bad = mid
    return next_fire(schedule, dst, good, anchor)


def count_fires(
    schedule: Schedule, dst: DstPolicy, anchor: datetime, since: datetime, until: datetime
) -> int | None:
    """How many occurrences lie in (since, until]; None when only walking could tell (cron)."""
    if until <= since:
        return 0
    if schedule.kind == "once":
        return int(since < _run_at(schedule) <= until)
    if schedule.kind == "cron":
        return None
    last = latest_fire(schedule, dst, anchor, since, until)
    first = next_fire(schedule, dst, since, anchor)
    if last is None or first is None:
        return 0
    return (last - first) // _step(schedule) + 1


def _flagged(
    schedule: Schedule, dst: DstPolicy, after: datetime, anchor: datetime
) -> Iterator[tuple[datetime, str | None]]:
    _refuse_naive(after, anchor)
    if schedule.kind == "once":
        run_at = _run_at(schedule)
        if run_at > after:
            yield run_at, None
        return
    if schedule.start_at is not None and after < schedule.start_at:
        # Occurrences must be >= start_at: "> start_at less a microsecond" says that exactly.
        after = schedule.start_at - _ONE_MICROSECOND
    if schedule.kind == "cron":
        stream = cron.occurrences(cron.parse_cron(schedule.cron), schedule.zone, dst.gap, dst.overlap, after)
    else:
        stream = _interval_occurrences(schedule, after, anchor)
    try:
        for at, flag in stream:
            if schedule.end_at is not None and at > schedule.end_at:
                return
            yield at, flag
    except OverflowError:
        # The next occurrence lies past year 9999: none that can be represented remains.
        return


def _refuse_naive(*instants: datetime) -> None:
    if any(instant.tzinfo is None for instant in instants):
        # astimezone() would read a naive time as the HOST's local time: a silent bug.
        raise ValueError("naive datetime: every instant in Punctual is aware UTC")


def _run_at(schedule: Schedule) -> datetime:
    assert schedule.run_at is not None  # parse_schedule sets it on every "once" schedule
    return schedule.run_at


def _step(schedule: Schedule) -> timedelta:
    assert schedule.interval_s is not None  # parse_schedule sets it on every "interval" schedule
    return timedelta(seconds=schedule.interval_s)


def _grid(schedule: Schedule, anchor: datetime) -> tuple[datetime, int]:
    """The interval grid's origin and its first index."""
    if schedule.start_at is not None:
        return schedule.start_at, 0
    return anchor, 1  # the creation instant itself is not an occurrence


def _interval_occurrences(
    schedule: Schedule, after: datetime, anchor: datetime
) -> Iterator[tuple[datetime, str | None]]:
    origin, k_min = _grid(schedule, anchor)
    step = _step(schedule)
    # timedelta // timedelta is exact integer arithmetic on microseconds: no float drift.
    k = max(k_min, (after - origin) // step + 1)
    zone = schedule.zone
    while True:
        at = origin + k * step
        yield at, _overlap_flag(at, zone)
        k += 1


def _overlap_flag(at: datetime, zone: ZoneInfo) -> str | None:
    # An interval is never moved by DST, but its local time can still be one that
    # occurs twice; preview flags that the same way as for cron.
    if zone.key == "UTC":
        return None
    local = at.astimezone(zone)
    kind, _first, _second = cron.resolve_local(local.replace(tzinfo=None), zone)
    if kind != "overlap":
        return None
    return cron.OVERLAP_SECOND if local.fold else cron.OVERLAP_FIRST
