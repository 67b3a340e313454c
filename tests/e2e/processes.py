"""Real Punctual processes for end-to-end tests: `celery -A app worker` and `beat`.

Each runs in its own session (process group), so `kill()` takes a prefork worker's
children with it, as a SIGKILL of a container would. Output goes to a log file
under the test's tmp dir; `tail()` shows it when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The `celery` script of the venv that runs the tests (scripts/test's .venv in CI).
CELERY = str(Path(sys.executable).parent / "celery")


def child_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a child: the caller's without its PUNCTUAL_* settings, then
    `env`. A setting exported in the shell must not reach a worker unseen: a test would
    depend on it, and a bench would record the shipped default for a value it did
    not run with."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PUNCTUAL_")}
    return {**inherited, **env, "PYTHONUNBUFFERED": "1"}


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=child_env(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL of the group if it lingers."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._kill_group()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the process and its children at once: a crash, nothing flushed."""
        self._kill_group()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def _kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_worker(
    env: dict[str, str],
    log_dir: Path,
    name: str = "worker",
    concurrency: int = 2,
    queues: list[str] | None = None,
) -> Proc:
    shards = int(env.get("PUNCTUAL_SHARDS", "16"))
    queues = queues or [f"shard-{s:02d}" for s in range(shards)]
    argv = [
        CELERY,
        "-A",
        "app",
        "worker",
        "-Q",
        ",".join(queues),
        "-c",
        str(concurrency),
        "-n",
        f"{name}@%h",
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    return Proc(name, argv, env, log_dir)


def start_beat(env: dict[str, str], log_dir: Path, name: str = "beat") -> Proc:
    return Proc(name, [CELERY, "-A", "app", "beat", "--loglevel", "WARNING"], env, log_dir)


def wait_ready(proc: Proc, seconds: float = 3.0) -> None:
    """Give a process time to connect; fail early if it died on start."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited on start:\n{proc.tail()}")
        time.sleep(0.1)
