"""What `punctual dev` runs: the children's environment and command lines (pure).

The children are the production programs, started the production way, on the
embedded defaults: `punctual api` (gunicorn), `celery -A app worker` and
`celery -A app beat`. Only their environment differs:

- the registry, broker and limiter are the embedded ones: PUNCTUAL_DATABASE_URLS,
  PUNCTUAL_BROKER_URL and PUNCTUAL_REDIS_URL are removed (and reported), so the
  registry is `<data dir>/registry.sqlite3`, the broker the folders of
  app.devserver.broker and the limiter the worker's in-process one;
- PUNCTUAL_DATA_DIR is the data dir as an absolute path (the children agree on it
  whatever their cwd);
- PUNCTUAL_DEV_MODE=1 serves the /dev/echo target;
- PUNCTUAL_ALLOW_PRIVATE_TARGETS=1: the point of a dev server is to call targets on
  this machine (its own /dev/echo at 127.0.0.1, a receiver being written). This is
  dev mode's own setting; the production default and its checks are unchanged.

Every other PUNCTUAL_* variable the user set reaches the children as it is.

One worker process consumes every shard queue: its thread pool runs the polls and
dispatches, so there is one poller on the SQLite file and one in-process limiter
that every call goes through. The API runs one gunicorn worker, so /dev/echo's
in-memory record is one record.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.settings import Settings
from app.tasks.routing import shard_queues

EMBEDDED = ("PUNCTUAL_DATABASE_URLS", "PUNCTUAL_BROKER_URL", "PUNCTUAL_REDIS_URL")

WORKER_THREADS = 4  # Celery task threads: polls and dispatches (calls run on the dispatcher's own threads)
API_THREADS = 8

# How long each child gets to stop after SIGTERM before it is killed. The worker
# lets calls in flight finish (app.worker.context.shutdown_context waits up to 30 s).
GRACE_S = {"beat": 10.0, "worker": 35.0, "api": 10.0}
STOP_ORDER = ("beat", "worker", "api")  # no new polls; finish the calls; then the API they may be calling


@dataclass(frozen=True)
class Plan:
    env: dict[str, str]
    ignored: tuple[str, ...]  # embedded-default variables the user had set


def child_environment(base: Mapping[str, str], data_dir: Path) -> Plan:
    ignored = tuple(name for name in EMBEDDED if base.get(name))
    env = {name: value for name, value in base.items() if name not in EMBEDDED}
    env.update(
        PUNCTUAL_DATA_DIR=str(data_dir),
        PUNCTUAL_DEV_MODE="1",
        PUNCTUAL_ALLOW_PRIVATE_TARGETS="1",
        PYTHONUNBUFFERED="1",  # their log lines reach the terminal as they happen
    )
    return Plan(env, ignored)


def commands(settings: Settings, host: str, port: int, python: str = sys.executable) -> dict[str, list[str]]:
    """argv of each child by name. `python -m` runs them on this interpreter (this venv)."""
    data_dir = settings.data_dir
    return {
        "api": [
            python,
            "-m",
            "app.cli",
            "api",
            "--host",
            host,
            "--port",
            str(port),
            "--workers",
            "1",
            "--threads",
            str(API_THREADS),
            "--graceful-timeout",
            "5",
        ],
        # -q: no startup banner (the supervisor prints its own).
        "worker": [
            python,
            "-m",
            "celery",
            "-A",
            "app",
            "-q",
            "worker",
            "-Q",
            ",".join(shard_queues(settings)),
            "--pool",
            "threads",
            "--concurrency",
            str(WORKER_THREADS),
            "--hostname",
            "dev@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
            "--include",
            "app.devserver.probe",
        ],
        # The beat scheduler is in-memory (celeryconfig); --schedule keeps the file
        # of any persistent scheduler in the data dir, not in the user's cwd.
        "beat": [
            python,
            "-m",
            "celery",
            "-A",
            "app",
            "-q",
            "beat",
            "--schedule",
            str(data_dir / "celerybeat-schedule"),
            "--loglevel",
            "WARNING",
        ],
    }
