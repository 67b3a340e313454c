"""The Celery application: `celery -A app worker -Q shard-07`, `celery -A app beat`.

The official Flask-less wiring: one module-level `app`, configured from the
top-level `celeryconfig` module (which reads Settings.from_env once). Tasks live in
app/tasks and are bound with `shared_task`, so importing them never imports this
module first.

Worker processes serve Prometheus metrics when PUNCTUAL_METRICS_PORT is set: with
the prefork pool each child process i listens on PUNCTUAL_METRICS_PORT + i (the
children do the counting; prometheus_client keeps counters per process); with a
solo or threads pool the worker process listens on PUNCTUAL_METRICS_PORT itself.
"""
from __future__ import annotations

import logging

from celery import Celery, signals

app = Celery("punctual")
app.config_from_object("celeryconfig")

log = logging.getLogger("punctual.worker")


def _serve_metrics(port: int) -> None:
    from prometheus_client import start_http_server

    try:
        start_http_server(port)
        log.info("metrics on :%d", port)
    except OSError as exc:  # a port in use must not stop the worker
        log.warning("metrics port %d: %s", port, exc)


@signals.worker_process_init.connect
def _child_started(**_kw) -> None:
    """A prefork child: forget the parent's connections, serve this child's metrics."""
    from billiard.process import current_process

    from app.worker.context import reset_after_fork
    from app.settings import get_settings

    reset_after_fork()
    port = get_settings().metrics_port
    if port:
        _serve_metrics(port + (current_process().index or 0))


@signals.worker_ready.connect
def _worker_ready(sender=None, **_kw) -> None:
    from app.settings import get_settings

    port = get_settings().metrics_port
    pool = getattr(sender, "pool", None)
    prefork = pool is not None and type(pool).__module__.endswith("prefork")
    if port and not prefork:
        _serve_metrics(port)


@signals.worker_process_shutdown.connect
def _child_stopping(**_kw) -> None:
    """Let calls in flight finish and their completions flush before the child exits."""
    from app.worker.context import shutdown_context

    shutdown_context()


@signals.worker_shutdown.connect
def _worker_stopping(**_kw) -> None:
    from app.worker.context import shutdown_context

    shutdown_context()
