"""`punctual api`: the HTTP API under gunicorn, the production WSGI server.

Workers: gunicorn's gthread worker, `--workers` processes (default: the number of
CPU cores, because a request is mostly Python work and the GIL gives one core per
process) x `--threads` threads each (default 8: a create waits on its commit's WAL
flush, and more commits in flight share one flush). On a 2-core box that is 2 x 8,
which served creates best of the shapes tried; set `--workers` to
2 x cores + 1 when requests wait on slow shards more than they compute. Keep
workers x threads within PUNCTUAL_DB_POOL_SIZE x 2 (the pool's overflow included).
Connections are opened lazily in each worker after the fork (never shared with the master).

Graceful shutdown: SIGTERM (or SIGINT) stops accepting connections and lets
requests in flight finish for up to --graceful-timeout seconds; SIGHUP reloads the
workers one by one.
"""

from __future__ import annotations

import os

import click

from app.cli.ops import load_registry, load_settings

DEFAULT_THREADS = 8
LIMIT_REQUEST_LINE = 4094
LIMIT_REQUEST_FIELD_SIZE = 8190
LIMIT_REQUEST_FIELDS = 100


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def control_socket_path(host: str, port: int) -> str:
    """gunicorn's control socket (`gunicornc -s PATH`) for the instance serving host:port.

    gunicorn's default is one path per user and host ($XDG_RUNTIME_DIR/gunicorn.ctl
    or ~/.gunicorn/gunicorn.ctl): a second API on the host unlinks the first one's
    socket and takes the path, and when it stops the first is left with none. So
    each instance gets its own file in that directory, named after what it serves.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        directory = runtime
    else:
        directory = os.path.join(os.path.expanduser("~"), ".gunicorn")
    name = f"punctual-api-{host}-{port}.ctl" if port else f"punctual-api-pid{os.getpid()}.ctl"
    return os.path.join(directory, name)


def gunicorn_options(
    host: str,
    port: int,
    workers: int,
    threads: int,
    graceful_timeout_s: int,
    control_socket: str | None = None,
) -> dict:
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        # gthread, answering the requests gunicorn refuses itself as problem+json.
        "worker_class": "app.cli.gthread_worker.ProblemWorker",
        "threads": threads,
        "graceful_timeout": graceful_timeout_s,
        "timeout": 60,
        "keepalive": 5,
        # gunicorn's own defaults, written out because docs/api.md states them: a longer
        # request line is 414, a longer header line or more headers 431.
        "limit_request_line": LIMIT_REQUEST_LINE,
        "limit_request_field_size": LIMIT_REQUEST_FIELD_SIZE,
        "limit_request_fields": LIMIT_REQUEST_FIELDS,
        # Recycle workers now and then so a slow leak cannot grow forever; jittered
        # so they do not all restart at once.
        "max_requests": 100_000,
        "max_requests_jitter": 10_000,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "info",
        "proc_name": "punctual-api",
        # Workers touch a heartbeat file on every loop; on a disk-backed /tmp that
        # write can block a worker (gunicorn's own advice: use a tmpfs).
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") else None,
        "control_socket": control_socket or control_socket_path(host, port),
        # gunicorn's own lines (start, workers, errors) in PUNCTUAL_LOG_FORMAT; the
        # access log is the app's (app.api.access_log), which knows the owner.
        "logger_class": "app.cli.gunicorn_logger.GunicornLogger",
    }


@click.command("api")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for all)."
)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--workers", type=int, default=None, help="Worker processes [default: CPU cores].")
@click.option("--threads", type=int, default=DEFAULT_THREADS, show_default=True, help="Threads per worker.")
@click.option(
    "--graceful-timeout",
    "graceful_timeout_s",
    type=int,
    default=30,
    show_default=True,
    help="Seconds requests in flight get to finish on SIGTERM.",
)
@click.option(
    "--control-socket",
    "control_socket",
    default=None,
    metavar="PATH",
    help="gunicorn's control socket for `gunicornc -s PATH` [default: punctual-api-HOST-PORT.ctl "
    "in $XDG_RUNTIME_DIR or ~/.gunicorn, one per instance].",
)
def api(
    host: str,
    port: int,
    workers: int | None,
    threads: int,
    graceful_timeout_s: int,
    control_socket: str | None,
) -> None:
    """Serve the HTTP API under gunicorn.

    gthread workers; SIGTERM stops accepting and lets requests in flight finish.
    """
    from gunicorn.app.base import BaseApplication

    settings = load_settings()  # a bad variable stops here, before any worker starts
    # So does a DSN list the shard map refuses; the check's connections do not cross the fork.
    load_registry(serving=True).dispose()

    class _Server(BaseApplication):
        def load_config(self):
            options = gunicorn_options(
                host, port, workers or default_workers(), threads, graceful_timeout_s, control_socket
            )
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self):
            from app.api import create_app
            from app.logs import configure

            configure("api", settings.log_format)  # in each worker: the app's loggers, the access log
            return create_app(settings)

    _Server().run()


COMMANDS = [api]
