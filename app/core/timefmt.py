"""RFC 3339 instants: the one place that parses and prints them.

Every instant Punctual stores or sends is UTC. Parsing rejects naive times (no
offset): docs/api.md requires an explicit `Z` or `+hh:mm`. Printing uses `Z` and writes
a fraction only when the instant has one, so `Idempotency-Key`,
`Punctual-Scheduled-For` and a run's `scheduled_for` are the same string.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta, timezone

# RFC 3339 date-time: a 'T' (or space, or lowercase t), seconds required, offset required.
# ASCII digits ([0-9], not \d, which takes any script's), and fullmatch, not `$`, which
# also matches before a final newline.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_NAIVE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?")


def parse_instant(text: object) -> datetime:
    """Parse an RFC 3339 date-time with an offset into an aware UTC datetime.

    Raises ValueError with a message fit for a 422 when the text is not one.
    """
    if not isinstance(text, str):
        raise ValueError("must be an RFC 3339 date-time string")
    return _parse_text(text)


# A burst's runs share a handful of instants (their scheduled_for, their fire_at), and
# each one's instants are parsed from its dispatch message and printed into its
# headers and writes: cached, that is a dictionary lookup rather than a regex and a
# strftime per run. Only valid texts and UTC datetimes are cached (an error is not),
# and both are immutable, so an entry never goes stale.
_CACHED_INSTANTS = 4096


@functools.lru_cache(maxsize=_CACHED_INSTANTS)
def _parse_text(text: str) -> datetime:
    match = _RFC3339.fullmatch(text)
    if not match:
        if _NAIVE.fullmatch(text):
            raise ValueError("must carry a UTC offset ('Z' or '+01:00'); naive times are rejected")
        raise ValueError("must be an RFC 3339 date-time such as 2026-12-01T00:00:00Z")
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    micros = int((fraction[1:] + "000000")[:6]) if fraction else 0
    if offset in ("Z", "z"):
        tz = UTC
    else:
        sign = 1 if offset[0] == "+" else -1
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError("has an invalid UTC offset")
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        local = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=tz
        )
        return local.astimezone(UTC)
    except ValueError as exc:  # 2026-02-30, hour 24, leap second 60
        raise ValueError(f"is not a valid date-time ({exc})") from None
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before datetime.min in UTC
        raise ValueError("is out of the supported range of instants") from None


def format_instant(moment: datetime) -> str:
    """Print an aware datetime as RFC 3339 UTC with `Z`.

    A fraction is written only when the instant has one: milliseconds when that is
    exact (trigger instants), microseconds otherwise.
    """
    if moment.tzinfo is None:
        raise ValueError("naive datetime: every instant in Punctual is aware UTC")
    # Converted before the cache looks: two aware datetimes of one zone compare equal by
    # their wall time alone, even when a fold makes them different instants.
    return _format_utc(moment.astimezone(UTC))


@functools.lru_cache(maxsize=_CACHED_INSTANTS)
def _format_utc(moment: datetime) -> str:
    # Not strftime("%Y"): glibc does not pad years below 1000 to four digits.
    text = f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}"
    if moment.microsecond:
        if moment.microsecond % 1000 == 0:
            text += f".{moment.microsecond // 1000:03d}"
        else:
            text += f".{moment.microsecond:06d}"
    return text + "Z"


def format_local(moment: datetime) -> str:
    """Print an aware datetime as RFC 3339 with its own offset (schedule previews)."""
    text = f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}"
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    offset = moment.utcoffset() or timedelta(0)
    total = int(offset.total_seconds())
    sign = "+" if total >= 0 else "-"
    total = abs(total)
    return f"{text}{sign}{total // 3600:02d}:{total % 3600 // 60:02d}"


def utcnow() -> datetime:
    """The wall clock, aware UTC. Pure modules never call this: `now` is an argument."""
    return datetime.now(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """An aware instant as whole microseconds since the Unix epoch: exact, unlike a
    float timestamp (an instant compared with the registry's, or kept in a text)."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(micros: int) -> datetime:
    """`to_micros`'s inverse, aware UTC."""
    return _EPOCH + micros * _MICROSECOND


def truncate_to_ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)
