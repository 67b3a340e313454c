"""The one place a job body is validated, shared by create (POST) and patch (PATCH).

Contract:
- `validate_job(body, allow_private=...)` -> JobSpec for a create: `name`, `target`
  and `schedule` are required; the optional fields take their defaults.
- `validate_changes(body, allow_private=...)` -> dict of the fields a PATCH names,
  each parsed exactly as a create parses it (a field replaces the old one whole).
- Both raise app.core.errors.ValidationError listing EVERY bad field at once, with dotted
  JSON paths (`target.url`, `retry.max_attempts`); unknown top-level fields are
  refused. A null optional field means "the default" (JSON merge-patch reading).

The constants below are the API's limits; app/api/openapi.py builds the document
from them so the contract and the check cannot drift apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from app.core.delivery import is_reserved_header
from app.core.errors import FieldError, ValidationError
from app.core.jitter import parse_jitter_s
from app.core.labels import parse_labels, parse_selector_object
from app.core.misfire import MISFIRE_POLICIES, parse_misfire
from app.core.overlap import DEFAULT_OVERLAP, parse_overlap
from app.core.private_targets import TargetPolicy
from app.core.retries import RetryPolicy, parse_retry
from app.core.schedules import DstPolicy, Schedule, parse_dst, parse_schedule
from app.services import addresses

JOB_FIELDS = (
    "name",
    "target",
    "payload",
    "schedule",
    "retry",
    "misfire",
    "dst",
    "jitter_s",
    "labels",
    "overlap",
)
REQUIRED_FIELDS = ("name", "target", "schedule")
WEBHOOK_FIELDS = ("type", "url", "method", "headers", "timeout_s", "limits")
QUEUE_FIELDS = ("type", "topic", "limits")
POSTGRES_FIELDS = ("type", "database", "limits")
LIMITS_FIELDS = ("key", "rate_per_s", "max_concurrency")
SELECTOR_FIELDS = ("labels",)  # the body of POST /jobs/pause, /resume, /cancel

NAME_MAX = 200
URL_MAX = 2048
METHODS = ("POST", "PUT", "GET", "DELETE", "PATCH")
DEFAULT_METHOD = "POST"
TIMEOUT_S = (1, 900)
DEFAULT_TIMEOUT_S = 30
HEADERS_MAX = 64
HEADER_NAME_MAX = 256
HEADER_VALUE_MAX = 8192
TOPIC_MAX = 255
LIMITS_KEY_MAX = 200
RATE_PER_S = (0.01, 100_000)
MAX_CONCURRENCY = (1, 10_000)
PAYLOAD_DEPTH_MAX = 64
MIN_YEAR = 1000

# Every pattern here is used with fullmatch: `$` also matches before a final newline,
# and "X-Team\n" is not a header name.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 token)
# An AMQP topic routing key: dot-separated words; `*` and `#` are for bindings only.
_DATABASE_ALIAS = re.compile(r"[a-z][a-z0-9_]{0,62}")
_TOPIC = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")
_SURROGATES = re.compile("[\ud800-\udfff]")
# Control characters: C0, DEL and C1 (Unicode category Cc); a header value may hold a tab.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_TAB = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class JobSpec:
    """A valid job body, every default filled in."""

    name: str
    target: dict
    payload: Any
    schedule: Schedule
    retry: RetryPolicy
    misfire: str
    dst: DstPolicy
    jitter_s: int
    labels: dict[str, str]
    overlap: str


def validate_job(
    body: object, *, allow_private: TargetPolicy, resolve: addresses.Resolve | None = None
) -> JobSpec:
    """Validate a create body; raises ValidationError naming every bad field.

    `resolve` looks up a webhook target's host (addresses.resolve_target when None;
    a batch passes the results of resolving all its hosts at once)."""
    values = _validate(body, allow_private=allow_private, required=REQUIRED_FIELDS, resolve=resolve)
    return JobSpec(
        name=values["name"],
        target=values["target"],
        payload=values.get("payload"),
        schedule=values["schedule"],
        retry=values.get("retry", RetryPolicy()),
        misfire=values.get("misfire", MISFIRE_POLICIES[0]),
        dst=values.get("dst", DstPolicy()),
        jitter_s=values.get("jitter_s", 0),
        labels=values.get("labels", {}),
        overlap=values.get("overlap", DEFAULT_OVERLAP),
    )


def validate_changes(body: object, *, allow_private: TargetPolicy) -> dict[str, Any]:
    """Validate a PATCH body: the named fields, parsed as a create parses them."""
    return _validate(body, allow_private=allow_private, required=())


def _validate(
    body: object,
    *,
    allow_private: TargetPolicy,
    required: tuple[str, ...],
    resolve: addresses.Resolve | None = None,
) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError.single("body", "must be a JSON object")
    errors: list[FieldError] = []
    for key in body:
        if key not in JOB_FIELDS:
            errors.append(FieldError(str(key), _NOT_A_FIELD.get(key, "unknown field")))
    for key in required:
        if body.get(key) is None:
            errors.append(FieldError(key, "is required"))
    values: dict[str, Any] = {}
    parsers: dict[str, Callable[[Any, Any], Any]] = (
        _PARSERS if resolve is None else {**_PARSERS, "target": partial(_target, resolve=resolve)}
    )
    for key, parse in parsers.items():
        if key not in body or (key in required and body[key] is None):
            continue
        unstorable = _unstorable(body[key], key)
        if unstorable:
            errors.extend(unstorable)
            continue
        try:
            values[key] = parse(body[key], allow_private)
        except ValidationError as exc:
            errors.extend(exc.errors)
        except ValueError as exc:
            errors.append(FieldError(key, str(exc)))
        except OverflowError:  # an instant near year 1 or 9999 whose offset leaves the range
            errors.append(FieldError(key, "has an instant out of range (years 1000 to 9999)"))
    if errors:
        raise ValidationError(errors)
    return values


def validate_selector(body: object) -> dict[str, str]:
    """The body of a label verb (`{"labels": {"team": "billing"}}`): the pairs a job
    must all carry. At least one: an empty selector would act on every job."""
    if not isinstance(body, dict):
        raise ValidationError.single("body", "must be a JSON object")
    errors = [FieldError(str(key), "unknown field") for key in body if key not in SELECTOR_FIELDS]
    try:
        selector = parse_selector_object(body.get("labels"), "labels")
    except ValidationError as exc:
        errors.extend(exc.errors)
    if errors:
        raise ValidationError(errors)
    return selector


# Fields a job has but a body cannot set, and where they come from instead.
_NOT_A_FIELD = {"key": "unknown field: a job's key is set by PUT /jobs/by-key/{key}"}


# --- fields ------------------------------------------------------------------------


def _name(value: object, _allow_private: bool) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= NAME_MAX:
        raise ValueError(f"must be a string of 1 to {NAME_MAX} characters")
    return value


def _payload(value: object, _allow_private: bool) -> Any:
    return value  # any JSON; _unstorable already refused what Postgres cannot keep


def _misfire(value: object, _allow_private: bool) -> str:
    return parse_misfire(value)


def _jitter(value: object, _allow_private: bool) -> int:
    return 0 if value is None else parse_jitter_s(value)


def _target(value: object, allow_private: TargetPolicy, resolve: addresses.Resolve | None = None) -> dict:
    if not isinstance(value, dict):
        raise ValidationError.single("target", "must be an object with type 'webhook', 'queue' or 'postgres'")
    kind = value.get("type")
    allowed: tuple[str, ...]
    check: Callable[[dict[str, Any], dict[str, Any], list[FieldError], Any], None]
    if kind == "webhook":
        allowed, check = WEBHOOK_FIELDS, partial(_webhook, resolve=resolve or addresses.resolve_target)
    elif kind == "queue":
        allowed, check = QUEUE_FIELDS, _queue
    elif kind == "postgres":
        allowed, check = POSTGRES_FIELDS, _postgres
    else:
        raise ValidationError.single("target.type", "must be 'webhook', 'queue' or 'postgres'")
    errors = [FieldError(f"target.{key}", "unknown field") for key in value if key not in allowed]
    target: dict = {"type": kind}
    check(value, target, errors, allow_private)
    if value.get("limits") is not None:
        target["limits"] = _limits(value["limits"], errors)
    if errors:
        raise ValidationError(errors)
    return target


def _webhook(
    value: dict,
    target: dict,
    errors: list[FieldError],
    allow_private: TargetPolicy,
    resolve: addresses.Resolve,
) -> None:
    url = value.get("url")
    url_error = _url_problem(url)
    if url_error is None:
        assert isinstance(url, str)  # _url_problem passes only a non-empty str
        try:
            addresses.target_host(url)  # a URL the worker would refuse before connecting
            resolve(url, allow_private)
        except addresses.TargetAddressError as exc:
            url_error = str(exc)
    if url_error:
        errors.append(FieldError("target.url", url_error))
    target["url"] = url
    method = value.get("method")
    if method is None:
        method = DEFAULT_METHOD
    elif method not in METHODS:
        errors.append(FieldError("target.method", f"must be one of {', '.join(METHODS)}"))
    target["method"] = method
    target["headers"] = _headers(value.get("headers"), errors)
    timeout_s = value.get("timeout_s")
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
    elif not _number_in(timeout_s, *TIMEOUT_S):
        errors.append(
            FieldError(
                "target.timeout_s", f"must be a number of seconds from {TIMEOUT_S[0]} to {TIMEOUT_S[1]}"
            )
        )
    target["timeout_s"] = timeout_s


def webhook_urls(bodies: list[Any]) -> list[str]:
    """The webhook target URLs of job bodies that validation will resolve (the ones
    that pass every other check of a URL): what a batch resolves at once."""
    found = []
    for body in bodies:
        target = body.get("target") if isinstance(body, dict) else None
        url = target.get("url") if isinstance(target, dict) and target.get("type") == "webhook" else None
        if _url_problem(url) is None:
            assert isinstance(url, str)  # _url_problem passes only a non-empty str
            found.append(url)
    return found


def _url_problem(url: object) -> str | None:
    if not isinstance(url, str) or not url:
        return "is required: an http(s) URL"
    if len(url) > URL_MAX:
        return f"must be at most {URL_MAX} characters"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return "is not a valid URL"
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http or https URL"
    if not parts.hostname:
        return "must name a host"
    if _CONTROL.search(url) or any(c.isspace() for c in url):
        return "must not contain whitespace or control characters"
    return None


def _headers(value: object, errors: list[FieldError]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.append(FieldError("target.headers", "must be an object of header names to string values"))
        return {}
    if len(value) > HEADERS_MAX:
        errors.append(FieldError("target.headers", f"at most {HEADERS_MAX} headers"))
    for name, header_value in value.items():
        field = f"target.headers.{name}"
        if len(name) > HEADER_NAME_MAX or not _TOKEN.fullmatch(name):
            errors.append(
                FieldError(
                    field, f"is not a valid header name (a token of at most {HEADER_NAME_MAX} characters)"
                )
            )
        elif is_reserved_header(name):
            errors.append(FieldError(field, "is set by Punctual and cannot be overridden"))
        if (
            not isinstance(header_value, str)
            or len(header_value) > HEADER_VALUE_MAX
            or _CONTROL_BUT_TAB.search(header_value)
        ):
            errors.append(
                FieldError(
                    field,
                    f"must be a string of at most {HEADER_VALUE_MAX} characters without control characters",
                )
            )
    return dict(value)


def _queue(value: dict, target: dict, errors: list[FieldError], _allow_private: TargetPolicy) -> None:
    topic = value.get("topic")
    if not isinstance(topic, str) or len(topic) > TOPIC_MAX or not _TOPIC.fullmatch(topic):
        errors.append(
            FieldError(
                "target.topic",
                "must be a routing key of dot-separated words"
                f" (letters, digits, _ and -), at most {TOPIC_MAX} characters",
            )
        )
    target["topic"] = topic


def _postgres(value: dict, target: dict, errors: list[FieldError], _allow_private: TargetPolicy) -> None:
    """The shape of the alias only: whether it is configured and granted to the owner
    is app.services.target_grants' check (it needs the settings and the owner)."""
    database = value.get("database")
    if not isinstance(database, str) or not _DATABASE_ALIAS.fullmatch(database):
        errors.append(
            FieldError(
                "target.database",
                "must be the alias of a target database (lowercase letters, digits and _)",
            )
        )
    target["database"] = database


def _limits(value: object, errors: list[FieldError]) -> dict:
    if not isinstance(value, dict):
        errors.append(FieldError("target.limits", "must be an object with key, rate_per_s, max_concurrency"))
        return {}
    errors.extend(
        FieldError(f"target.limits.{key}", "unknown field") for key in value if key not in LIMITS_FIELDS
    )
    limits = {key: value[key] for key in LIMITS_FIELDS if value.get(key) is not None}
    key = limits.get("key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= LIMITS_KEY_MAX):
        errors.append(
            FieldError("target.limits.key", f"must be a string of 1 to {LIMITS_KEY_MAX} characters")
        )
    if "rate_per_s" in limits and not _number_in(limits["rate_per_s"], *RATE_PER_S):
        errors.append(
            FieldError(
                "target.limits.rate_per_s", f"must be a number from {RATE_PER_S[0]} to {RATE_PER_S[1]}"
            )
        )
    concurrency = limits.get("max_concurrency")
    if concurrency is not None and not (
        _is_integer(concurrency) and MAX_CONCURRENCY[0] <= concurrency <= MAX_CONCURRENCY[1]
    ):
        errors.append(
            FieldError(
                "target.limits.max_concurrency",
                f"must be an integer from {MAX_CONCURRENCY[0]} to {MAX_CONCURRENCY[1]}",
            )
        )
    elif concurrency is not None:
        limits["max_concurrency"] = int(concurrency)
    return limits


def _number_in(value: object, low: float, high: float) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and low <= value <= high
    )


def _is_integer(value: object) -> bool:
    return not isinstance(value, bool) and (
        isinstance(value, int) or isinstance(value, float) and value.is_integer()
    )


def schedule_in_range(schedule: Schedule, field: str = "schedule") -> Schedule:
    """`schedule` when each of its instants lies in the years 1000-9999, else ValidationError.

    Why: app.core.timefmt prints years with strftime, which does not zero-pad years below
    1000, so such an instant would come back as text that is not RFC 3339.
    """
    errors = [
        FieldError(f"{field}.{key}", f"must be in the years {MIN_YEAR} to 9999")
        for key in ("run_at", "start_at", "end_at")
        if getattr(schedule, key) is not None and getattr(schedule, key).year < MIN_YEAR
    ]
    if errors:
        raise ValidationError(errors)
    return schedule


def run_at_not_past(schedule: Schedule, now: datetime, grace_s: float, field: str = "schedule") -> Schedule:
    """`schedule`, unless it is a one-off whose run_at passed more than `grace_s` ago.

    Why: such a job would be skipped as a misfire the moment it is claimed; refusing
    it at once tells the caller (often a clock or time-zone mistake) instead.
    Within the grace it is accepted and fires at once.
    """
    if schedule.kind == "once" and schedule.run_at is not None:
        late_s = (now - schedule.run_at).total_seconds()
        if late_s > grace_s:
            raise ValidationError.single(
                f"{field}.run_at",
                f"is {late_s:.0f} s in the past; at most PUNCTUAL_MISFIRE_GRACE_S={grace_s:g} s is accepted",
            )
    return schedule


# Each parser takes the value and the private-target policy (TargetPolicy; most ignore it).
_PARSERS: dict[str, Callable[[Any, Any], Any]] = {
    "name": _name,
    "target": _target,
    "payload": _payload,
    "schedule": lambda value, _p: schedule_in_range(parse_schedule(value, "schedule")),
    "retry": lambda value, _p: parse_retry(value, "retry"),
    "misfire": _misfire,
    "dst": lambda value, _p: parse_dst(value, "dst"),
    "jitter_s": _jitter,
    "labels": lambda value, _p: parse_labels(value, "labels"),
    "overlap": lambda value, _p: parse_overlap(value),
}


def _unstorable(value: object, path: str) -> list[FieldError]:
    """Strings Postgres cannot keep (NUL, lone surrogates) and absurd nesting, by path.

    Valid JSON can carry both, and jsonb/text would refuse them with a 500; saying
    where they are is kinder. Iterative, so a deep document cannot blow the stack.
    Nesting counts containers: `[[1]]` is 2 levels, and at most PAYLOAD_DEPTH_MAX are
    taken (the field's own value is the first).
    """
    errors: list[FieldError] = []
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth >= PAYLOAD_DEPTH_MAX and isinstance(item, (dict, list)):
            errors.append(FieldError(path, f"is nested more than {PAYLOAD_DEPTH_MAX} levels deep"))
            break
        if isinstance(item, str):
            if "\x00" in item or _SURROGATES.search(item):
                errors.append(FieldError(where, "must not contain NUL characters or lone surrogates"))
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key or _SURROGATES.search(key):
                    errors.append(FieldError(where, "has a key with NUL characters or lone surrogates"))
                stack.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{where}.{index}", depth + 1) for index, child in enumerate(item))
    return errors
