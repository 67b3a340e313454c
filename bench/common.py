"""What the component benchmarks (bench.create, bench.claim) share: fresh databases
made in-process, `punctual api`, a cheap HTTP client and the result file.

`Stack` makes fresh Postgres databases (--physical of them, 16 logical shards),
an owner and key, and, when asked, a fresh RabbitMQ vhost and Redis prefix, and
`punctual api` (gunicorn); leaving the `with` stops it and drops what it made. The
end-to-end benchmarks (bench.burst, bench.steady, bench.peers) start Punctual as a
user does instead: bench/stack.py.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from bench.stack import base_env

RESULTS = Path(__file__).resolve().parent / "results"
PG_ADMIN = os.environ.get(
    "PUNCTUAL_BENCH_PG", os.environ.get("PUNCTUAL_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")
)
AMQP_BASE = os.environ.get("PUNCTUAL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")
REDIS_URL = os.environ.get("PUNCTUAL_TEST_REDIS", "redis://127.0.0.1:6379/0")


def admin_engine():
    import sqlalchemy as sa

    from app.registry.engines import engine_url

    return sa.create_engine(engine_url(PG_ADMIN), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Connection:
    """A minimal keep-alive HTTP/1.1 client: the load generator must cost the box as
    little as it can, since it shares the cores with what it measures (http.client
    spends about twice the CPU per request)."""

    def __init__(self, host: str, port: int):
        self.address = (host, port)
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.body = b""  # the last answer's body

    def post(self, path: str, headers: dict[str, str], body: bytes) -> int:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buffer = b""
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {self.address[0]}\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        header, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = header.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(b":", 1)[1]) for line in lines[1:] if line.lower().startswith(b"content-length:")
        )
        while len(self.buffer) < length:
            self._read()
        self.body, self.buffer = self.buffer[:length], self.buffer[length:]
        if any(line.lower().startswith(b"connection: close") for line in lines[1:]):
            self.close()
        return status

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def wait_healthy(url: str, timeout_s: float = 30) -> None:
    parts = urlsplit(url)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: the API at {url} did not become healthy")


class Stack:
    """Fresh databases (and, with broker=True, a vhost and Redis prefix) plus the
    processes started on them; torn down on exit."""

    def __init__(
        self,
        physical: int = 2,
        shards: int = 16,
        broker: bool = False,
        env: dict[str, str] | None = None,
        dsns: list[str] | None = None,
    ):
        self.physical, self.shards, self.broker = physical, shards, broker
        self.extra_env = dict(env or {})
        self.given_dsns = dsns  # attach to these instead of making databases
        self.databases: list[str] = []
        self.vhost: str | None = None
        self.server: subprocess.Popen | None = None
        self.procs: list = []
        self.workers: list = []
        self.log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-"))

    def __enter__(self) -> Stack:
        import sqlalchemy as sa

        from app.registry.engines import registry_for
        from app.registry.migrate import migrate_all
        from app.services.owners import create_key
        from app.settings import Settings

        self.admin = admin_engine()
        try:
            if self.given_dsns:
                dsns = tuple(self.given_dsns)
            else:
                for _ in range(self.physical):
                    name = f"bench_{uuid.uuid4().hex[:10]}"
                    with self.admin.connect() as conn:
                        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
                    self.databases.append(name)
                base = sa.engine.make_url(PG_ADMIN)
                dsns = tuple(
                    base.set(database=n).render_as_string(hide_password=False) for n in self.databases
                )
            migrate_all(dsns, shards=self.shards)
            self.dsns = dsns
            self.env = {
                "PUNCTUAL_DATABASE_URLS": ",".join(dsns),
                "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
                "PUNCTUAL_SHARDS": str(self.shards),
            }
            if self.broker:
                self.vhost = f"bench_{uuid.uuid4().hex[:10]}"
                subprocess.run(
                    ["rabbitmqctl", "-q", "add_vhost", self.vhost], check=True, capture_output=True
                )
                subprocess.run(
                    ["rabbitmqctl", "-q", "set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*"],
                    check=True,
                    capture_output=True,
                )
                self.env.update(
                    {
                        "PUNCTUAL_BROKER_URL": f"{AMQP_BASE}/{self.vhost}",
                        "PUNCTUAL_REDIS_URL": REDIS_URL,
                        "PUNCTUAL_REDIS_PREFIX": f"pt-bench-{uuid.uuid4().hex[:8]}",
                    }
                )
            self.env.update(self.extra_env)
            self.settings = Settings.from_env(self.env)
            self.registry = registry_for(self.settings)
            self.owner = f"bench-{uuid.uuid4().hex[:6]}"
            self.api_key = create_key(self.registry, self.owner).api_key
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_api(self, workers: int | None = None, threads: int | None = None) -> str:
        port = free_port()
        command = [sys.executable, "-m", "app.cli", "api", "--host", "127.0.0.1", "--port", str(port)]
        if workers:
            command += ["--workers", str(workers)]
        if threads:
            command += ["--threads", str(threads)]
        # Only the stack's settings: the result records exactly those (bench.stack.base_env).
        self.server = subprocess.Popen(command, env={**base_env(), **self.env}, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        wait_healthy(self.url)
        return self.url

    def count_jobs(self) -> int:
        import sqlalchemy as sa

        total = 0
        for engine in self.registry.engines:
            with engine.connect() as conn:
                total += conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one()
        return total

    def __exit__(self, *_exc) -> None:
        for proc in self.procs:
            proc.stop()
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)  # graceful: gunicorn lets requests finish
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
        from app.registry.engines import _registries

        for key in list(_registries):
            _registries.pop(key).dispose()
        for name in self.databases:
            with self.admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if self.vhost:
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.vhost], capture_output=True)
        self.admin.dispose()


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "note": "Postgres, RabbitMQ, Redis, the API, beat, the workers, the sink and the bench share one box",
        "postgres_autovacuum": postgres_setting("autovacuum"),
    }


def postgres_setting(name: str) -> str | None:
    """A setting of the PostgreSQL server the bench uses (None if it cannot be read).
    Autovacuum matters: without it a fresh database is never analyzed, and the planner
    works from the empty tables `punctual migrate` made (bench/README.md)."""
    import psycopg

    try:
        dsn = PG_ADMIN.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]
    except psycopg.Error:
        return None


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def code_version() -> str:
    """The commit measured (with "+dirty" when the tree has uncommitted changes):
    a figure is only comparable to another of the same code."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app", "celeryconfig.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def write_result(kind: str, result: dict, label: str = "") -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result.setdefault("bench", kind)
    result.setdefault("at", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    result.setdefault("command", "python -m bench." + kind + " " + " ".join(sys.argv[1:]))
    result.setdefault("commit", code_version())
    path = RESULTS / f"{kind}{'-' + label if label else ''}-{stamp()}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def shown(path: Path) -> str:
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
