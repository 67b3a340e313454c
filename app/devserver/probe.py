"""The worker's readiness signal for `punctual dev`, loaded with `celery worker --include`.

Once the worker consumes its queues it writes `<data dir>/run/worker.ready` (its
pid). `punctual dev` removes the file before it starts the worker and prints its
banner only after the file appears, so a job scheduled from the banner's example
a few seconds ahead is polled on time rather than waiting for a worker still
starting up.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import signals


def ready_file(data_dir: Path) -> Path:
    return data_dir / "run" / "worker.ready"


@signals.worker_ready.connect
def _worker_ready(**_kw) -> None:
    from app.settings import get_settings

    path = ready_file(get_settings().data_dir.resolve())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
