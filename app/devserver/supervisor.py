"""The supervisor of `punctual dev`: prepare the data dir, run the stack, stop it cleanly.

`run(host, port, data_dir)` returns the exit status:
1. the data dir (mode 0700: it holds the registry with the signing secrets) and
   its lock, so two `punctual dev` never share one registry and broker;
2. settings from the children's environment (app.devserver.stack): a bad
   PUNCTUAL_* value stops here with one line; the port must be free;
3. the SQLite registry migrated (safe to repeat), the dev owner's key
   (app.devserver.credentials);
4. the API, the worker and beat started (app.devserver.children); the banner is
   printed once the API answers /healthz and the worker consumes its queues
   (app.devserver.probe), within READY_TIMEOUT_S;
5. then it waits for SIGINT or SIGTERM, or for a child to exit on its own;
6. the children stop in stack.STOP_ORDER, each with its grace; a second Ctrl-C
   kills what is left at once. Whatever happens, no child outlives `run`.

0 after a requested stop; 1 when a child failed or the stack did not come up;
2 for a bad setting, a busy port or a data dir in use.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from app.core.errors import SettingsError
from app.devserver import banner, credentials, probe, stack
from app.devserver.children import Child

READY_TIMEOUT_S = 60.0


class StartError(Exception):
    """The stack cannot start; the message says why. `status` is the exit status."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


class _Console:
    """Lines from the supervisor and every child's relay, one whole line at a time.

    With PUNCTUAL_LOG_FORMAT=json every line is one JSON object: a child's JSON line
    passes as it is (it names its process), any other child line (a crash before its
    logging is set up) is wrapped with the child's name, and the supervisor's own
    lines, the banner included, are records of process `dev`.
    """

    def __init__(self, stream=None, json_lines: bool = False):
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()
        self._open = True
        self._json = json_lines

    def __call__(self, line: str) -> None:
        if self._json:
            line = _json_line(line)
        with self._lock:
            if not self._open:
                return
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # nobody reads any more: drop the output, keep running
                self._open = False


_CHILD_LINE = re.compile(r"^(api|worker|beat)\s* \| (.*)$", re.S)


def _json_line(line: str) -> str:
    from app.logs import JsonFormatter

    process, message = "dev", line
    child = _CHILD_LINE.match(line)
    if child:
        process, message = child.groups()
        if message.startswith("{"):
            try:
                json.loads(message)
                return message
            except ValueError:
                pass
    record = logging.LogRecord("punctual.dev", logging.INFO, __file__, 0, message, (), None)
    return JsonFormatter(process).format(record)


class _Signals:
    """SIGINT/SIGTERM: the first asks for a stop, the next for a kill."""

    def __init__(self):
        self.count = 0
        self.stop = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _signum, _frame) -> None:
        self.count += 1
        self.stop.set()

    @property
    def hurry(self) -> bool:
        return self.count > 1


def run(host: str, port: int, data_dir: Path, stream=None) -> int:
    say = _Console(stream, json_lines=os.environ.get("PUNCTUAL_LOG_FORMAT", "").strip().lower() == "json")
    signals = _Signals()
    signals.install()
    children: dict[str, Child] = {}
    lock: int | None = None
    try:
        data_dir = data_dir.resolve()
        lock = _lock_data_dir(data_dir)
        plan = stack.child_environment(os.environ, data_dir)
        settings = _settings(plan.env)
        _check_port(host, port)
        url = f"http://{_url_host(host)}:{port}"
        say(f"punctual dev: data dir {data_dir}; migrating the registry")
        key = _prepare_registry(settings, data_dir)
        env_file = credentials.write_env_file(data_dir, url, key)
        ready_path = probe.ready_file(data_dir)
        ready_path.unlink(missing_ok=True)
        for name, argv in stack.commands(settings, host, port).items():
            children[name] = Child(name, argv, plan.env, Path.cwd(), say)
        for child in children.values():  # every fork before the first pump thread
            child.start()
        for child in children.values():
            child.pump()
        if not _wait_ready(children, url, ready_path, signals.stop):
            return _stop(children, signals, say, failed=not signals.stop.is_set())
        say("")
        say(banner.banner(url, key, data_dir, env_file, plan.ignored))
        say("")
        failed = _watch(children, signals, say)
        return _stop(children, signals, say, failed)
    except StartError as exc:
        say(f"punctual dev: {exc}")
        return _stop(children, signals, say, failed=True, status=exc.status)
    finally:
        for child in children.values():  # nothing outlives run(), whatever raised
            if child.alive():
                child.kill()
        if lock is not None:
            os.close(lock)


def _lock_data_dir(data_dir: Path) -> int:
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_dir = data_dir / "run"
    run_dir.mkdir(exist_ok=True)
    fd = os.open(run_dir / "dev.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StartError(
            f"another `punctual dev` is using {data_dir} (stop it, or pass --data-dir)"
        ) from None
    return fd


def _settings(env: dict[str, str]):
    from app.settings import Settings, use_settings

    try:
        settings = Settings.from_env(env)
    except SettingsError as exc:
        raise StartError(str(exc)) from None
    use_settings(settings)
    return settings


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe_socket:
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe_socket.bind((host, port))
        except OSError as exc:
            reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise StartError(f"{host}:{port} {reason}; pass another --port") from None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _prepare_registry(settings, data_dir: Path):
    from app.registry.engines import registry_for
    from app.registry.migrate import migrate_all

    migrate_all(settings.database_urls, shards=settings.shards)
    registry = registry_for(settings)
    try:
        return credentials.dev_key(registry, data_dir)
    finally:
        registry.dispose()  # the children open their own connections


def _wait_ready(children: dict[str, Child], url: str, ready_path: Path, stop: threading.Event) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    api_up = False
    while not stop.is_set():
        for child in children.values():
            if not child.alive():
                raise StartError(
                    f"{child.name} exited on start (status {child.returncode}); see its output above", 1
                )
        api_up = api_up or _healthy(url)
        if api_up and ready_path.exists():
            return True
        if time.monotonic() > deadline:
            waiting = [
                name for name, up in (("the API", api_up), ("the worker", ready_path.exists())) if not up
            ]
            raise StartError(f"{' and '.join(waiting)} did not come up within {READY_TIMEOUT_S:g}s", 1)
        stop.wait(0.2)
    return False


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _watch(children: dict[str, Child], signals: _Signals, say: Callable[[str], None]) -> bool:
    """Wait for a stop request (False) or a child's own exit (True)."""
    while not signals.stop.wait(0.5):
        for child in children.values():
            if not child.alive():
                say(f"punctual dev: {child.name} exited (status {child.returncode}); stopping the rest")
                return True
    return False


def _stop(
    children: dict[str, Child], signals: _Signals, say: Callable[[str], None], failed: bool, status: int = 1
) -> int:
    running = [children[name] for name in stack.STOP_ORDER if name in children and children[name].alive()]
    if running:
        say("punctual dev: stopping (Ctrl-C again to kill at once)")
    started = time.monotonic()
    for child in running:
        child.terminate()
        deadline = time.monotonic() + stack.GRACE_S[child.name]
        while not child.wait(0.1):
            if signals.hurry or time.monotonic() > deadline:
                say(f"punctual dev: killing {child.name}")
                break
        child.kill()
    for child in children.values():
        child.kill()  # the leader exited; sweep the rest of its group
    if running:
        say(f"punctual dev: stopped in {time.monotonic() - started:.1f}s")
    return status if failed else 0
