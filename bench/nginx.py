"""The webhook sink of every benchmark: nginx from Debian's packages, not Python.

A sink in Python shares the GIL-bound costs of what it measures and flatters no one
in particular; nginx answers `200` for any path under /hook/ and writes one
access-log line per call: when it arrived ($msec), the path, and the
Punctual-Attempt, Idempotency-Key and Punctual-Scheduled-For headers. The bench
writes its own nginx.conf in a temporary folder, starts `nginx -p DIR -c
nginx.conf` on a free port of 127.0.0.1 and stops it (SIGQUIT: the log buffer is
flushed) afterwards. Arrivals are read back from the access log.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.figures import Arrival
from bench.stack import die_with_parent

NGINX = Path("/usr/sbin/nginx")
INSTALL_COMMAND = "apt-get update && apt-get install -y nginx"
# Fields are separated by spaces: none of them can hold one ($request_uri is
# escaped, header values here are ids and timestamps); nginx writes "-" for a
# missing header.
LOG_FORMAT = "$msec $request_uri $http_punctual_attempt $http_idempotency_key $http_punctual_scheduled_for"

CONFIG = """\
worker_processes 2;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    log_format bench '{log_format}';
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /hook/ {{
            access_log {root}/access.log bench buffer=256k flush=250ms;
            return 200 "ok";
        }}
        location / {{ return 404; }}
    }}
}}
"""


def parse_access_line(line: str) -> Arrival | None:
    """One line of the access log in LOG_FORMAT; None for a line that is not one."""
    fields = line.split()
    if len(fields) != 5:
        return None
    try:
        at = float(fields[0])
    except ValueError:
        return None

    def header(value: str) -> str:
        return "" if value == "-" else value

    return Arrival(
        at=at,
        path=fields[1],
        attempt=header(fields[2]),
        key=header(fields[3]),
        scheduled_for=header(fields[4]),
    )


def ensure_nginx(install: bool) -> None:
    """Find nginx; with `install` (as root) install it from Debian's packages, else
    stop with the one command that does."""
    if NGINX.exists():
        return
    if install and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "nginx"],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        return
    raise SystemExit(
        f"bench: the sink is nginx, not found at {NGINX}. Install it with:\n    {INSTALL_COMMAND}\n"
        "(or run the bench as root with --install-sink)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NginxSink:
    """`with NginxSink() as sink:` nginx answering 200 on sink.url(path) for paths
    under /hook/; sink.arrivals() reads what it logged so far."""

    def __init__(self, install: bool = False):
        ensure_nginx(install)
        self.root = Path(tempfile.mkdtemp(prefix="punctual-bench-nginx-"))
        self.port = _free_port()
        self.log = self.root / "access.log"
        self._offset = 0
        self._arrivals: list[Arrival] = []
        self.process: subprocess.Popen | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def pid(self) -> int:
        """The master's pid: its tree (master and workers) is the sink's CPU."""
        return self.process.pid

    def __enter__(self) -> NginxSink:
        for folder in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.root / folder).mkdir()
        (self.root / "nginx.conf").write_text(
            CONFIG.format(root=self.root, port=self.port, log_format=LOG_FORMAT)
        )
        self.log.touch()
        # -g 'daemon off;': the master stays our child, so its pid is ours to stop.
        self.process = subprocess.Popen(
            [str(NGINX), "-p", str(self.root), "-c", str(self.root / "nginx.conf"), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(
                    f"bench: nginx exited on start: {self.process.stderr.read().decode().strip()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                if (self.root / "nginx.pid").exists():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.__exit__()
        raise SystemExit("bench: nginx did not start listening within 10 s")

    def arrivals(self) -> list[Arrival]:
        """Every call logged so far (the log is written in 256 KiB buffers, flushed
        every 250 ms, so the last quarter second may still be on its way)."""
        if not self.log.exists():  # stopped: everything was read on the way out
            return list(self._arrivals)
        with self.log.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            arrival = parse_access_line(line)
            if arrival is not None:
                self._arrivals.append(arrival)
        return list(self._arrivals)

    def __exit__(self, *_exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: writes out the log buffer
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.arrivals()  # take in the last lines before the folder goes
        shutil.rmtree(self.root, ignore_errors=True)
