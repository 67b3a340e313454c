"""Logging for every Punctual process: readable text (default) or one JSON object per line.

PUNCTUAL_LOG_FORMAT picks the format for the API, beat, the workers, `punctual
migrate` and `punctual dev`'s children alike, so a log shipper parses one shape.
A JSON line carries `ts` (UTC, ms), `level`, `logger`, `process` (api, beat, worker,
migrate, dev), `pid`, `message`, the fields of the run being worked on (job_id,
run_id, shard, attempt, owner) and any other `extra=` a call site passed; a
traceback goes in `exc`, escaped, so it never breaks the one-line rule. A traceback
shows its innermost TRACEBACK_FRAMES frames per exception, however deep the stack
(a RecursionError's would be thousands of lines).

The run's fields come from a contextvar (`log_context`) rather than from every call
site: a dispatch binds them once around the work on one run, and whatever logs
inside (the webhook caller, the limiter, SQLAlchemy's warnings) carries them.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

FORMATS = ("text", "json")
TRACEBACK_FRAMES = 30
# The fields that say which piece of work a line is about, in the order shown.
CONTEXT_FIELDS = ("job_id", "run_id", "shard", "attempt", "owner")

_context: ContextVar[dict | _Lazy | None] = ContextVar("punctual_log_context", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
# Marks the handler configure() installed, so a second call replaces it.
_HANDLER_MARK = "_punctual_handler"


@contextmanager
def log_context(**fields) -> Iterator[None]:
    """Within the block, every log line of this thread (or task) carries `fields`."""
    token = _context.set(_over(_fields(), fields))
    try:
        yield
    finally:
        _context.reset(token)


class lazy_log_context:  # noqa: N801 - used like log_context, a function's name
    """log_context whose fields are made by `make()` only if a line is logged in the
    block. A worker binds a run's fields around each call, and rendering them (ids as
    text) for every run cost more than the lines logged during calls, which are few."""

    __slots__ = ("_make", "_token")

    def __init__(self, make: Callable[[], dict]):
        self._make = make

    def __enter__(self) -> None:
        self._token = _context.set(_Lazy(_fields(), self._make))

    def __exit__(self, *_exc) -> None:
        _context.reset(self._token)


class _Lazy:
    """The fields of a lazy_log_context over those bound outside it; made once."""

    __slots__ = ("_outer", "_make", "_made")

    def __init__(self, outer: dict, make: Callable[[], dict]):
        self._outer, self._make = outer, make
        self._made: dict | None = None

    def fields(self) -> dict:
        if self._made is None:
            self._made = _over(self._outer, self._make())
        return self._made


def _over(outer: dict, fields: dict) -> dict:
    """`fields` bound over `outer`: an inner value wins; None binds nothing."""
    return {**outer, **{k: v for k, v in fields.items() if v is not None}}


def _fields() -> dict:
    bound = _context.get()
    if bound is None:
        return {}
    return bound.fields() if isinstance(bound, _Lazy) else bound


def current_context() -> dict:
    return dict(_fields())


class ContextFilter(logging.Filter):
    """Copies the bound context onto each record (an explicit `extra=` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def _extras(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES and not k.startswith("_")}


def bounded_traceback(exc_info) -> str:
    """The traceback of `exc_info` with the innermost TRACEBACK_FRAMES frames of each
    exception in its chain, and a line saying how many were left out."""
    _, exc, tb = exc_info
    depth = len(traceback.extract_tb(tb)) if tb is not None else 0
    lines = traceback.format_exception(exc, limit=-TRACEBACK_FRAMES)
    if depth > TRACEBACK_FRAMES:
        lines.insert(1, f"  ... {depth - TRACEBACK_FRAMES} outer frames left out\n")
    return "".join(lines).rstrip("\n")


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str = ""):
        super().__init__()
        self.process_name = process_name

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return bounded_traceback(ei)

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "process": self.process_name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        extras = _extras(record)
        for name in CONTEXT_FIELDS:
            if name in extras:
                entry[name] = extras.pop(name)
        entry.update((k, v) for k, v in extras.items() if k not in entry)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`2026-11-30 18:00:00,123 INFO punctual.worker [worker] message job_id=... shard=3`."""

    def __init__(self, process_name: str = ""):
        super().__init__("%(asctime)s %(levelname)s %(name)s [" + (process_name or "-") + "] %(message)s")

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return bounded_traceback(ei)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}" for name in CONTEXT_FIELDS if hasattr(record, name)
        )
        if not context:
            return text
        first, newline, rest = text.partition("\n")  # keep a traceback below the line it belongs to
        return f"{first} {context}{newline}{rest}"


def formatter(log_format: str, process_name: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: one of {', '.join(FORMATS)}")
    return JsonFormatter(process_name) if log_format == "json" else TextFormatter(process_name)


def handler(log_format: str, process_name: str, stream=None) -> logging.Handler:
    """A stream handler (stderr by default) with the format and the context filter."""
    out = logging.StreamHandler(stream or sys.stderr)
    out.setFormatter(formatter(log_format, process_name))
    out.addFilter(ContextFilter())
    setattr(out, _HANDLER_MARK, True)
    return out


def configure(
    process_name: str, log_format: str, level: int | str = logging.INFO, stream=None
) -> logging.Handler:
    """Route the root logger (and so every library's logger) through one handler.

    Safe to call again (a forked child, a second setup): the handler installed by an
    earlier call is replaced, other handlers are left alone.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    new = handler(log_format, process_name, stream)
    root.addHandler(new)
    root.setLevel(level)
    # Python warnings (Celery's "running as root", deprecations) become log lines too,
    # so that nothing on stderr escapes the format.
    logging.captureWarnings(True)
    return new


# Celery's loggers of a task's "received" and "succeeded" lines.
_TASK_LINE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


class QuietTasks(logging.Filter):
    """Drops Celery's INFO lines ("received", "succeeded") of the tasks named, unless
    their logger is at DEBUG. (Celery passes the task's name in the line's one
    argument, its context.)"""

    def __init__(self, logger: logging.Logger, task_names: frozenset[str]):
        super().__init__()
        self._logger = logger
        self.task_names = task_names

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not isinstance(record.args, dict):
            return True
        return record.args.get("name") not in self.task_names or self._logger.isEnabledFor(logging.DEBUG)


def quiet_tasks(task_names: set[str]) -> None:
    """Celery's per-task INFO lines of these tasks only at DEBUG (QuietTasks); once per
    logger, whatever the number of calls."""
    for name in _TASK_LINE_LOGGERS:
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if not isinstance(f, QuietTasks)]
        logger.addFilter(QuietTasks(logger, frozenset(task_names)))
