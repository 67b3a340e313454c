"""app.logs: text or one JSON object per line, with the run's fields from the context."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from app.logs import (
    QuietTasks,
    configure,
    current_context,
    handler,
    lazy_log_context,
    log_context,
    quiet_tasks,
)


def _logger(log_format: str, process: str = "worker") -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    logger = logging.getLogger(f"punctual.test.{log_format}.{id(stream)}")
    logger.handlers[:] = [handler(log_format, process, stream)]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def _json_lines(stream: io.StringIO) -> list[dict]:
    lines = stream.getvalue().splitlines()
    return [json.loads(line) for line in lines]


def test_json_is_one_object_per_line_with_the_standard_fields():
    logger, stream = _logger("json", "beat")
    logger.info("tick %d", 7)
    [entry] = _json_lines(stream)
    assert entry["message"] == "tick 7"
    assert entry["level"] == "INFO" and entry["process"] == "beat" and entry["logger"] == logger.name
    assert entry["ts"].endswith("Z") and isinstance(entry["pid"], int)


def test_json_carries_the_bound_context_and_extras():
    logger, stream = _logger("json")
    with log_context(job_id="j-1", run_id="r-1", shard=3, attempt=2):
        logger.warning("call failed", extra={"status": 503})
        with log_context(attempt=3, owner=None):  # inner binds win; None binds nothing
            logger.warning("again")
    logger.warning("outside")
    first, second, third = _json_lines(stream)
    assert {k: first[k] for k in ("job_id", "run_id", "shard", "attempt", "status")} == {
        "job_id": "j-1",
        "run_id": "r-1",
        "shard": 3,
        "attempt": 2,
        "status": 503,
    }
    assert second["attempt"] == 3 and "owner" not in second
    assert not {"job_id", "run_id", "shard", "attempt"} & set(third)
    assert current_context() == {}


def test_a_lazy_context_makes_its_fields_only_for_a_line_logged_and_once():
    logger, stream = _logger("json")
    made = []

    def fields() -> dict:
        made.append(1)
        return {"run_id": "r-9", "attempt": 4, "owner": None}

    with log_context(shard=5):
        with lazy_log_context(fields):
            assert made == []  # nothing logged yet: nothing made
            logger.warning("first")
            with log_context(attempt=5):  # binds over the lazy fields, as over any
                logger.warning("inner")
            logger.warning("second")
            assert current_context() == {"shard": 5, "run_id": "r-9", "attempt": 4}
        logger.warning("outside")
    first, inner, second, outside = _json_lines(stream)
    assert made == [1]
    assert (first["shard"], first["run_id"], first["attempt"]) == (5, "r-9", 4) and "owner" not in first
    assert (inner["run_id"], inner["attempt"]) == ("r-9", 5)
    assert second["attempt"] == 4
    assert "run_id" not in outside and outside["shard"] == 5


def test_an_explicit_extra_wins_over_the_context():
    logger, stream = _logger("json")
    with log_context(shard=1):
        logger.info("x", extra={"shard": 9})
    assert _json_lines(stream)[0]["shard"] == 9


def test_a_traceback_stays_inside_its_one_json_line():
    logger, stream = _logger("json")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logger.exception("failed")
    [entry] = _json_lines(stream)  # json.loads of exactly one line
    assert "ValueError: bad" in entry["exc"] and entry["message"] == "failed"


def test_values_json_cannot_encode_are_written_as_text():
    import uuid

    logger, stream = _logger("json")
    run_id = uuid.uuid4()
    with log_context(run_id=run_id):
        logger.info("x", extra={"payload": object()})
    entry = _json_lines(stream)[0]
    assert entry["run_id"] == str(run_id) and entry["payload"].startswith("<object")


def test_text_puts_the_context_at_the_end_of_the_first_line():
    logger, stream = _logger("text", "api")
    with log_context(job_id="j-1", shard=3):
        logger.info("started")
    line = stream.getvalue().rstrip("\n")
    assert "\n" not in line
    assert line.endswith("started job_id=j-1 shard=3") and "[api]" in line and " INFO " in line


def test_the_context_belongs_to_its_thread():
    logger, stream = _logger("json")
    seen = {}

    def other() -> None:
        seen["context"] = current_context()
        logger.info("other thread")

    with log_context(run_id="r-main"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen["context"] == {}
    assert "run_id" not in _json_lines(stream)[0]


def test_configure_replaces_its_own_handler_and_keeps_others():
    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    try:
        first = io.StringIO()
        configure("migrate", "json", stream=first)
        second = io.StringIO()
        configure("migrate", "json", stream=second)
        logging.getLogger("punctual.test.configure").info("once")
        assert first.getvalue() == ""
        assert [e["message"] for e in _json_lines(second)] == ["once"]
        assert all(h in root.handlers for h in before)
    finally:
        root.handlers[:] = before
        root.setLevel(level)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="one of text, json"):
        handler("yaml", "api")


def test_quiet_tasks_keeps_celerys_per_task_lines_of_the_ticks_for_debug(caplog: pytest.LogCaptureFixture):
    from celery.app import trace
    from celery.worker import strategy

    quiet_tasks({"punctual.poll"})
    try:
        for level, shown in ((logging.INFO, False), (logging.DEBUG, True)):
            caplog.clear()
            with caplog.at_level(level, logger="celery"):
                for name in ("punctual.poll", "punctual.dispatch"):
                    context = {"id": "1", "name": name, "args": "()", "kwargs": "{}", "eta": None}
                    strategy.logger.info(trace.LOG_RECEIVED, context, extra={"data": context})
                    trace.info(trace.LOG_SUCCESS, {**context, "return_value": "{}", "runtime": 0.1})
            lines = [r.getMessage() for r in caplog.records]
            # The dispatch's lines are always there; the poll's only at DEBUG.
            assert [line for line in lines if "punctual.dispatch" in line] == [
                "Task punctual.dispatch[1] received",
                "Task punctual.dispatch[1] succeeded in 0.1s: {}",
            ]
            assert bool([line for line in lines if "punctual.poll" in line]) is shown, lines
        # A warning or an error about a tick is never dropped.
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="celery"):
            trace.logger.error("Task %(name)s[%(id)s] raised", {"name": "punctual.poll", "id": "2"})
        assert [r.getMessage() for r in caplog.records] == ["Task punctual.poll[2] raised"]
    finally:
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logger = logging.getLogger(name)
            logger.filters = [f for f in logger.filters if not isinstance(f, QuietTasks)]


def _deep(levels: int) -> None:
    """Recurse through two alternating frames (Python folds only repeats of one line)."""
    if levels == 0:
        raise ValueError("at the bottom")
    _deeper(levels - 1)


def _deeper(levels: int) -> None:
    _deep(levels)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_traceback_shows_its_innermost_frames_only(log_format):
    from app.logs import TRACEBACK_FRAMES

    logger, stream = _logger(log_format)
    try:
        _deep(300)
    except ValueError:
        logger.exception("unhandled error")
    if log_format == "json":
        [entry] = _json_lines(stream)
        text = entry["exc"]
    else:
        text = stream.getvalue()
    assert text.count('File "') == TRACEBACK_FRAMES
    assert "outer frames left out" in text and text.rstrip().endswith("ValueError: at the bottom")
    assert len(text.splitlines()) < 3 * TRACEBACK_FRAMES
