"""`punctual dev` as a user runs it: a shell command in a directory, stopped from the terminal.

`DevProcess.start(command, workdir)` runs the command with bash in `workdir`, with
every PUNCTUAL_* variable unset and this venv first on PATH, in a session of its
own, its output in `workdir/dev.log`; it returns once the banner is printed.
`interrupt()` is Ctrl-C (SIGINT to the foreground process group, which holds the
shell and `punctual dev` but, by design, not the children); `terminate()` is
SIGTERM to `punctual dev` itself. `leftovers(workdir)` lists the processes whose
cwd is `workdir`: every child of `punctual dev` inherits it, so after a clean stop
there must be none.

Waits are bounded by generous ceilings; none of them is an assertion about speed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
BANNER = "Punctual dev is up"


def clean_env(path_first: Path = VENV_BIN) -> dict[str, str]:
    """This environment without PUNCTUAL_*, with `path_first` (default: this venv's bin) first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUNCTUAL_")}
    env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("VIRTUAL_ENV", None)
    return env


def wait_port_free(port: int, timeout_s: float = 30.0) -> None:
    """A previous `punctual dev` may still be letting go of the port; wait, then say so."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"port {port} stays busy: `punctual dev` as the README runs it needs it"
                    ) from None
        time.sleep(0.5)


def leftovers(workdir: Path) -> list[str]:
    """Command lines of live processes whose cwd is `workdir`."""
    target = str(workdir.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "cwd") != target:
                continue
            found.append(
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            )
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


@dataclass
class Banner:
    url: str
    api_key: str
    signing_secret: str


class DevProcess:
    def __init__(
        self, popen: subprocess.Popen, workdir: Path, log_path: Path, offset: int, start_timeout_s: float
    ):
        self.start_timeout_s = start_timeout_s
        self.popen = popen
        self.workdir = workdir
        self.log_path = log_path
        self._offset = offset  # where this start's output begins in the log

    @classmethod
    def start(
        cls,
        command: str,
        workdir: Path,
        port: int = 8000,
        path_first: Path = VENV_BIN,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> DevProcess:
        wait_port_free(port)
        log_path = workdir / "dev.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        log = open(log_path, "ab")
        popen = subprocess.Popen(
            ["bash", "-c", command],
            cwd=workdir,
            env=clean_env(path_first),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        dev = cls(popen, workdir, log_path, offset, start_timeout_s)
        dev._wait_for_banner()
        return dev

    @property
    def output(self) -> str:
        return self.log_path.read_bytes()[self._offset :].decode(errors="replace")

    def banner(self) -> Banner:
        text = self.output

        def field(name: str) -> str:
            return re.search(rf"^  {name}\s+(\S+)", text, re.MULTILINE).group(1)

        return Banner(field("URL"), field("API key"), field("Signing secret"))

    def _wait_for_banner(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while BANNER not in self.output:
            if self.popen.poll() is not None:
                raise RuntimeError(f"punctual dev exited ({self.popen.returncode}):\n{self.output[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"no banner within {self.start_timeout_s:g}s:\n{self.output[-4000:]}")
            time.sleep(0.2)
        time.sleep(0.2)  # the rest of the banner

    def interrupt(self) -> int:
        """Ctrl-C in the terminal; returns the exit status."""
        os.killpg(self.popen.pid, signal.SIGINT)
        return self._wait()

    def terminate(self) -> int:
        """SIGTERM to `punctual dev` (the shell's child, or the shell if it exec'd it)."""
        os.kill(self._dev_pid(), signal.SIGTERM)
        return self._wait()

    def kill_supervisor(self) -> None:
        """SIGKILL to `punctual dev` alone: nothing of it runs its shutdown code."""
        os.kill(self._dev_pid(), signal.SIGKILL)
        self._wait()

    def _dev_pid(self) -> int:
        """bash runs a one-command line by exec'ing it; a longer one keeps bash as the parent."""
        if not _cmdline(self.popen.pid).split(b"\0")[0].endswith(b"bash"):
            return self.popen.pid
        children = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children").read_text().split()
        return next(int(pid) for pid in children if b"punctual" in _cmdline(int(pid)))

    def _wait(self) -> int:
        try:
            return self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"punctual dev did not stop within {STOP_TIMEOUT_S:g}s:\n{self.output[-4000:]}"
            ) from None

    def kill(self) -> None:
        """Teardown of last resort: SIGKILL the shell's group and anything left in the workdir."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_leftovers(self.workdir)
        self.popen.wait(10)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_leftovers(workdir: Path) -> None:
    target = str(workdir.resolve())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if os.readlink(entry / "cwd") == target:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll `predicate` until it returns something truthy; fail after `timeout_s` naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g}s")
        time.sleep(interval_s)
