"""The preview of a schedule: its next fire instants, with DST flags, from query parameters.

One code path for `GET /schedules/preview` and for `punctual preview` computing
locally (no server named), so both answer the same. Parameters (docs/api.md
"Schedules preview: `GET /schedules/preview`"): `cron` or `interval_s`, `timezone` (default UTC), `count`
1-100 (default 10), `after` (default now, exclusive), `gap` and `overlap` (the job
defaults), and `start_at`/`end_at` as in a job's schedule. Every invalid parameter
is reported at once, named as the parameter (`cron`, not `schedule.cron`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from app.core.errors import FieldError, ValidationError
from app.core.schedules import PreviewItem, parse_dst, parse_schedule, parse_timezone, preview
from app.core.timefmt import parse_instant, utcnow
from app.services.validation import MIN_YEAR, schedule_in_range

COUNT = (1, 100)
DEFAULT_COUNT = 10


def preview_items(args: Mapping[str, str]) -> list[PreviewItem]:
    """The instants the query asks for; ValidationError naming every bad parameter."""
    schedule, dst, after, count = parse_preview_query(args)
    try:
        return preview(schedule, dst, after, count)
    except OverflowError:  # the occurrences run past year 9999
        raise ValidationError.single("after", "the occurrences after this instant are out of range") from None


def parse_preview_query(args: Mapping[str, str]):
    """(Schedule, DstPolicy, after, count) from the query; ValidationError naming each bad parameter."""
    errors: list[FieldError] = []

    def collect(name: str, parse):
        try:
            return parse()
        except ValidationError as exc:  # the core names fields "schedule.cron", "dst.gap"
            errors.extend(FieldError(e.field.split(".")[-1], e.message) for e in exc.errors)
        except ValueError as exc:
            errors.append(FieldError(name, str(exc)))
        except OverflowError:  # an instant whose offset takes it past year 1 or 9999
            errors.append(FieldError(name, "is out of range (years 1000 to 9999)"))
        return None

    cron, interval = args.get("cron"), args.get("interval_s")
    data: dict = {"start_at": args.get("start_at"), "end_at": args.get("end_at")}
    if (cron is None) == (interval is None):
        errors.append(FieldError("cron", "give exactly one of cron or interval_s"))
    elif cron is not None:
        data["cron"] = cron
    else:
        assert interval is not None  # exactly one of the two is given
        data["interval_s"] = collect("interval_s", lambda: _integer(interval))
    zone = collect("timezone", lambda: parse_timezone(args.get("timezone", "UTC")))
    after = collect("after", lambda: _after(args.get("after")))
    count = collect("count", lambda: _count(args.get("count")))
    dst = collect("dst", lambda: parse_dst({"gap": args.get("gap"), "overlap": args.get("overlap")}, "dst"))
    schedule = None
    if "cron" in data or data.get("interval_s") is not None:
        schedule = collect("cron", lambda: schedule_in_range(parse_schedule(data, "schedule")))
    if errors:
        raise ValidationError(errors)
    assert schedule is not None  # no errors: the schedule parsed
    # An interval grid ignores the zone, but its local times and overlap flags use it.
    return dataclasses.replace(schedule, timezone=zone), dst, after, count


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("must be an integer number of seconds") from None


def _after(raw: str | None):
    if raw is None:
        return utcnow()
    after = parse_instant(raw)
    if after.year < MIN_YEAR:
        raise ValueError(f"must be in the years {MIN_YEAR} to 9999")
    return after


def _count(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_COUNT
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not COUNT[0] <= value <= COUNT[1]:
        raise ValueError(f"must be an integer from {COUNT[0]} to {COUNT[1]}")
    return value
