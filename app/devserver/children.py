"""Supervised child processes of `punctual dev`: start, relay output, stop, leave none behind.

Contract:
- `Child.start()` runs argv in a new session, so the child and everything it forks
  (gunicorn's worker, say) form one process group of their own. A Ctrl-C in the
  terminal therefore reaches `punctual dev` alone, which stops the children in
  order (beat before the worker before the API that the worker may be calling)
  instead of all of them at once.
- On Linux a child is also told to get SIGTERM when `punctual dev` dies (prctl
  PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no orphans.
- `pump()` hands the child's output, line by line and prefixed with its name, to
  `emit` on a thread of its own; the pipe is always drained, so a child never
  blocks on its output whatever `emit` does with it.
- `terminate()` sends SIGTERM to the group (each program's own graceful shutdown);
  `wait(timeout_s)` says whether the leader exited; `kill()` sends SIGKILL to
  whatever is left of the group (also after a graceful exit: nothing lingers).

Start every child before pumping any: the pre-exec hook runs Python between fork
and exec, which is only safe while the supervisor has no other threads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _parent_death_signal():
    """A pre-exec hook that asks Linux to SIGTERM the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return hook


class Child:
    def __init__(
        self, name: str, argv: list[str], env: Mapping[str, str], cwd: Path, emit: Callable[[str], None]
    ):
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.cwd = cwd
        self.emit = emit
        self.popen: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self._started().pid

    def _started(self) -> subprocess.Popen[bytes]:
        if self.popen is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self.popen

    def start(self) -> None:
        self.popen = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )

    def pump(self) -> None:
        """Relay the child's output on a daemon thread (after every child has started)."""
        self._pump = threading.Thread(target=self._relay, name=f"pump-{self.name}", daemon=True)
        self._pump.start()

    def _relay(self) -> None:
        prefix = f"{self.name:<6} | "
        output = self._started().stdout
        assert output is not None  # started with stdout=PIPE
        for raw in iter(output.readline, b""):
            self.emit(prefix + raw.decode("utf-8", errors="replace").rstrip("\n"))
        output.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def terminate(self) -> None:
        if self.popen is not None:
            self._signal_group(signal.SIGTERM)

    def wait(self, timeout_s: float) -> bool:
        """True when the leader has exited (within `timeout_s`)."""
        if self.popen is None:
            return True
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL every process of the group, then reap the leader and finish relaying."""
        if self.popen is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if self._pump is not None:
            self._pump.join(5)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
