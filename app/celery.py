"""The Celery application: `celery -A app worker -Q shard-07`, `celery -A app beat`.

The official Flask-less wiring: one module-level `app`, configured from the
top-level `celeryconfig` module (which reads Settings.from_env once). Tasks live in
app/tasks and are bound with `shared_task`, so importing them never imports this
module first.

This module is the first thing `celery -A app ...` imports, so it is where every
Celery process (worker, beat, flower) checks its settings: a bad one ends the
command with the same one line `punctual` prints, before Celery prints anything.

Metrics: with PUNCTUAL_METRICS_PORT set, every process of a worker writes its
counts to one directory (prometheus-client's multiprocess mode, app.metrics_endpoint)
and the worker's main process serves their sum on that one port, whatever the pool
and however many children it has.

Logs: Celery's own set-up is replaced (the setup_logging signal) by app.logs, so
beat and the workers log in PUNCTUAL_LOG_FORMAT like every other process. A worker's
"received" and "succeeded" lines for the beat's ticks (a poll of every shard every
second, a sweep every few) come out only at DEBUG (app.logs.QuietTasks): at INFO they
were two lines a tick, 36 lines a second from an idle worker, and a good part of its
idle CPU. The dispatch messages' lines stay at INFO.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading

from celery import Celery, signals

from app.core.errors import SettingsError
from app.settings import get_settings
from app.tasks.routing import POLL_TASK, SWEEP_TASK
from app.tasks.turnstile import TurnstileStep

try:
    _settings = get_settings()
except SettingsError as _exc:
    sys.stderr.write(f"punctual: {_exc}\n")
    raise SystemExit(2) from None

if _settings.metrics_port:
    # Before anything imports prometheus_client: it picks its value class on import.
    from app.metrics_endpoint import use_multiprocess_dir

    use_multiprocess_dir()

app = Celery("punctual")
app.config_from_object("celeryconfig")
# Dispatch messages reach the pool in fair turns, not first come first served.
app.steps["consumer"].add(TurnstileStep)

log = logging.getLogger("punctual.worker")


def _role() -> str:
    """worker, beat or flower: the Celery subcommand this process runs, for the log lines."""
    for word in sys.argv[1:]:
        if word in ("worker", "beat", "flower"):
            return word
    return "celery"


@signals.setup_logging.connect
def _setup_logging(loglevel=None, **_kw) -> None:
    from app.logs import configure, quiet_tasks

    configure(_role(), _settings.log_format, loglevel or logging.INFO)
    quiet_tasks({POLL_TASK, SWEEP_TASK})


if _role() in ("worker", "beat"):
    # Now already, not only when Celery sets up logging: a worker warns (running as
    # root, say) before that, and the warning must come out in the format too.
    from app.logs import configure as _configure_logs

    _configure_logs(_role(), _settings.log_format, logging.WARNING)
    if _settings.log_format == "json":
        # The worker writes its shutdown notices ("worker: Warm shutdown (MainProcess)")
        # straight to stdout, past logging, from its signal handlers (celery.apps.worker
        # safe_say). In JSON mode they become log lines; logging's handler lock is
        # reentrant, so a signal arriving mid-line cannot deadlock it.
        import celery.apps.worker as _celery_worker

        def _say_as_log(msg, f=None) -> None:
            logging.getLogger("celery.apps.worker").warning(str(msg).strip())

        _celery_worker.safe_say = _say_as_log


@signals.worker_process_init.connect
def _child_started(**_kw) -> None:
    """A prefork child: forget the parent's connections."""
    from app.worker.context import reset_after_fork

    reset_after_fork()
    # Import the dispatch path now, not on the first dispatch message: under a burst
    # that message comes at the due instant, and the imports (Redis, urllib3, the SDK's
    # signature and its package) would take the busy box's CPU right then.
    # On a thread, so that the child takes its first task (a poll) without waiting.
    threading.Thread(target=_warm_up, name="warm-up", daemon=True).start()


def _warm_up() -> None:
    """Import the dispatch path, start the watch for dead workers' runs
    (app.worker.orphans), then set the collector for a worker (app.worker.collector)."""
    importlib.import_module("app.worker.engine")
    from app.worker import collector
    from app.worker.context import get_context

    try:
        get_context().roll  # noqa: B018  (made and started)
    except Exception:  # made again by the first dispatch
        logging.getLogger("punctual.orphans").warning("starting the watch failed", exc_info=True)
    collector.tune()


@signals.worker_ready.connect
def _worker_ready(**_kw) -> None:
    if _settings.metrics_port:
        from app.metrics_endpoint import serve

        serve(_settings.metrics_port)


@signals.worker_process_shutdown.connect
def _child_stopping(**_kw) -> None:
    """Let calls in flight finish and their completions flush before the child exits."""
    from app.metrics_endpoint import process_exited
    from app.worker.context import shutdown_context

    shutdown_context()
    process_exited(os.getpid())


@signals.worker_shutdown.connect
def _worker_stopping(**_kw) -> None:
    from app.worker.context import shutdown_context

    shutdown_context()


@signals.beat_init.connect
def _beat_started(**_kw) -> None:
    from app.beat import process as beat_process

    beat_process.start(_settings, _settings.beat_alive_file)


@signals.worker_init.connect
@signals.beat_init.connect
def _check_shard_map(**_kw) -> None:
    """Refuse to start, with one line, on a DSN list the stored shard map disagrees with
    (before any child is forked, so the check's connections are closed here)."""
    import os
    import sys

    from app.registry.engines import registry_for
    from app.registry.shard_map import MapUnavailable, ShardMapError
    from app.settings import get_settings

    registry = registry_for(get_settings())
    try:
        registry.check()
    except MapUnavailable as exc:  # the home is down for now: the tasks read the map when it is back
        log.warning("shard map not read at start: %s", exc)
    except ShardMapError as exc:
        # The real stderr: beat has redirected sys.stderr into its log by now.
        stderr = sys.__stderr__ or sys.stderr
        stderr.write(f"punctual: {exc}\n")
        stderr.flush()
        os._exit(2)  # Celery turns a SystemExit raised in a signal into a traceback
    finally:
        registry.dispose()
