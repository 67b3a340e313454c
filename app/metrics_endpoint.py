"""Where Prometheus scrapes a process group: one endpoint that counts every process in it.

A Celery worker is a main process and its prefork children, gunicorn a master and
its workers; the children do the counting. prometheus-client's multiprocess mode
makes each child write its values to files in PROMETHEUS_MULTIPROC_DIR, and one
MultiProcessCollector sums the files on every scrape, so one worker is one scrape
target on one port (PUNCTUAL_METRICS_PORT) however many children it has, and the
counts of a child that exited stay in the sums.

The directory must be chosen before prometheus_client makes its first metric
(the value class is picked when the module is imported), so `use_multiprocess_dir`
runs first thing in app.celery and in `punctual api`'s master. An operator may set
PROMETHEUS_MULTIPROC_DIR (one per worker; wipe it between runs, as the
prometheus-client docs say); otherwise each process group gets a new temporary
directory of its own, removed when it exits, so two workers on one host never
share or collide.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"

log = logging.getLogger("punctual.metrics")


def use_multiprocess_dir() -> Path:
    """Make sure this process (and every child it forks) writes values to a directory."""
    configured = os.environ.get(ENV)
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = Path(tempfile.mkdtemp(prefix="punctual-metrics-"))
        os.environ[ENV] = str(path)
        maker = os.getpid()

        def _remove() -> None:
            if os.getpid() == maker:  # a forked child inherits atexit hooks; only the maker cleans up
                shutil.rmtree(path, ignore_errors=True)

        atexit.register(_remove)
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        # prometheus_client was imported already (an embedding program, a test):
        # metrics made from now on write to the directory.
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]
    return path


def multiprocess() -> bool:
    return bool(os.environ.get(ENV))


def collecting_registry():
    """The registry a scrape reads: every process's files in multiprocess mode, else this process."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if not multiprocess():
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


def serve(port: int) -> bool:
    """Serve the group's metrics on `port` from this process; False if the port is taken."""
    from prometheus_client import start_http_server

    try:
        start_http_server(port, registry=collecting_registry())
    except OSError as exc:  # a taken port must not stop the worker: it still does its work
        log.error(
            "metrics: cannot listen on port %d (%s); PUNCTUAL_METRICS_PORT must differ per worker", port, exc
        )
        return False
    log.info("metrics on :%d (%s)", port, os.environ.get(ENV, "this process only"))
    return True


def process_exited(pid: int) -> None:
    """Forget a finished process's live gauges (its counters stay in the sums)."""
    if multiprocess():
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid)
