"""Punctual started the way the README's "Production topology" says, on fresh resources.

`PunctualStack` makes a fresh Postgres database, RabbitMQ vhost and Redis key
prefix, and runs, from the installed console scripts:

    punctual migrate
    punctual keys create --owner bench --json
    punctual api --host 127.0.0.1 --port <free port>
    celery -A app beat --loglevel INFO
    celery -A app worker --loglevel INFO -Q shard-00,...,shard-NN

with an environment that sets only the DSN, the broker, Redis (URL and the fresh
prefix) and PUNCTUAL_ALLOW_PRIVATE_TARGETS=1 (the sink is on 127.0.0.1), plus what
`--set PUNCTUAL_X=Y` asks for. Every other PUNCTUAL_* is the shipped default, and
any PUNCTUAL_* of the calling shell is dropped. Leaving the `with` stops the
processes (SIGTERM, as an operator would) and drops what was made.

The peers' benchmarks use the same fresh database and vhost helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.cpu import OWN_BACKENDS, CpuMeter

PG_ADMIN = os.environ.get("PUNCTUAL_BENCH_PG", "postgresql://root@127.0.0.1:5432/postgres")
AMQP_BASE = os.environ.get("PUNCTUAL_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672")
REDIS_URL = os.environ.get("PUNCTUAL_BENCH_REDIS", "redis://127.0.0.1:6379/0")
BIN = Path(sys.executable).parent  # the venv's console scripts: punctual, celery
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """(preexec_fn) Ask the kernel to SIGTERM this child when the bench dies, even by
    SIGKILL, so that no server of a bench outlives it (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def base_env() -> dict[str, str]:
    """The calling environment without any PUNCTUAL_* (no setting leaks in unseen)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PUNCTUAL_")}


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`--set PUNCTUAL_X=Y` values -> {name: value}; a clear error for anything else."""
    overrides = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("PUNCTUAL_"):
            raise SystemExit(f"bench: --set {pair!r}: expected PUNCTUAL_NAME=VALUE")
        overrides[name] = value
    return overrides


def effective_settings(env: dict[str, str]) -> dict[str, str]:
    """Every PUNCTUAL_* variable Punctual knows, with the value in effect under `env`
    (the shipped default where env does not set it). Validates them as the processes
    will, so a bad --set stops the bench with Punctual's own one-line error."""
    try:
        from app.settings import VARIABLES, Settings
    except ImportError as exc:  # pragma: no cover - only without the package installed
        raise SystemExit(f"bench: cannot import app.settings ({exc}); pip install -e '.[bench]'") from None
    from app.core.errors import SettingsError

    try:
        Settings.from_env(env)
    except SettingsError as exc:
        raise SystemExit(f"bench: {exc}") from None
    return {v.name: env.get(v.name) or v.default for v in VARIABLES}


@contextlib.contextmanager
def fresh_database(prefix: str = "bench") -> Iterator[str]:
    """A new, empty Postgres database on PG_ADMIN's server; its DSN. Dropped after."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_ADMIN.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def analyze(dsn: str, tables: tuple[str, ...]) -> None:
    """ANALYZE `tables` of the database at `dsn`, as autovacuum would have by the time a
    burst falls due (a bench's --analyze: this box's PostgreSQL runs without it)."""
    import psycopg

    with psycopg.connect(dsn.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        for table in tables:
            conn.execute(f"ANALYZE {table}")


@contextlib.contextmanager
def fresh_vhost(prefix: str = "bench") -> Iterator[str]:
    """A new RabbitMQ vhost (guest may use it); its AMQP URL. Deleted after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True)
    try:
        subprocess.run(
            ["rabbitmqctl", "-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )
        yield f"{AMQP_BASE}/{name}"
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True)


@contextlib.contextmanager
def fresh_redis_prefix() -> Iterator[str]:
    """A Redis key prefix no one uses; its keys are deleted after."""
    import redis

    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        client.close()


class Process:
    """A child process whose output goes to a log file; stop() asks it to end (SIGTERM)
    and kills it if it has not after `grace_s`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name, self.argv = name, argv
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=log_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_for(self, text: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log.read_text(errors="replace"):
            if self.popen.poll() is not None:
                raise SystemExit(f"bench: {self.name} exited on start:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: {self.name} not ready after {timeout_s:g} s:\n{self.tail()}")
            time.sleep(0.1)

    def stop(self, grace_s: float = 30) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)  # its own session: the children too
                self.popen.wait()


def wait_healthy(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: the API at {url} did not become healthy in {timeout_s:g} s")


class PunctualStack:
    """`with PunctualStack(overrides) as stack:` the production processes on fresh
    resources; stack.url, stack.api_key, stack.settings (every PUNCTUAL_* in effect),
    stack.components (name -> root pids, for the CPU meter), stack.database."""

    def __init__(
        self, overrides: dict[str, str] | None = None, prepare=None, replica_port: int | None = None
    ):
        """`prepare(dsn)`, if given, runs once the database is migrated, before any
        process starts (bench.prune writes a history there). `replica_port`: a
        streaming replica of the server there (scripts/pg-replica) serves the
        database's replica reads (PUNCTUAL_REPLICA_URLS)."""
        self.overrides = dict(overrides or {})
        self.prepare = prepare
        self.replica_port = replica_port
        self.exits = contextlib.ExitStack()
        self.processes: list[Process] = []
        self.log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-"))

    def _run(self, *argv: str) -> str:
        done = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]], env=self.env, cwd=self.log_dir, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"bench: `{' '.join(argv)}` failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def _start(self, name: str, *argv: str) -> Process:
        process = Process(name, [str(BIN / argv[0]), *argv[1:]], self.env, self.log_dir)
        self.processes.append(process)
        return process

    def __enter__(self) -> PunctualStack:
        try:
            self.database = self.exits.enter_context(fresh_database("bench_punctual"))
            broker = self.exits.enter_context(fresh_vhost())
            prefix = self.exits.enter_context(fresh_redis_prefix())
            self.env = {
                **base_env(),
                "PUNCTUAL_DATABASE_URLS": self.database,
                "PUNCTUAL_BROKER_URL": broker,
                "PUNCTUAL_REDIS_URL": REDIS_URL,
                "PUNCTUAL_REDIS_PREFIX": prefix,
                "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
                **self.overrides,
            }
            if self.replica_port is not None:
                replica = self.database.replace(":5432/", f":{self.replica_port}/", 1)
                self.env["PUNCTUAL_REPLICA_URLS"] = replica
            self.settings = effective_settings(self.env)
            self._run("punctual", "migrate")
            if self.replica_port is not None:
                caught_up(self.database, self.env["PUNCTUAL_REPLICA_URLS"])
            if self.prepare is not None:
                self.prepare(self.database)
            self.api_key = json.loads(self._run("punctual", "keys", "create", "--owner", "bench", "--json"))[
                "api_key"
            ]
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            api = self._start("api", "punctual", "api", "--host", "127.0.0.1", "--port", str(port))
            queues = ",".join(f"shard-{s:02d}" for s in range(int(self.settings["PUNCTUAL_SHARDS"])))
            worker = self._start(
                "worker", "celery", "-A", "app", "worker", "--loglevel", "INFO", "-Q", queues
            )
            beat = self._start("beat", "celery", "-A", "app", "beat", "--loglevel", "INFO")
            wait_healthy(self.url)
            worker.wait_for(" ready.")
            beat.wait_for("beat: Starting")
            self.components = {
                "workers (celery worker)": [worker.pid],
                "beat": [beat.pid],
                "api (gunicorn)": [api.pid],
            }
            self.commands = [" ".join(["punctual", "migrate"])] + [
                " ".join([Path(p.argv[0]).name, *p.argv[1:]]) for p in self.processes
            ]
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def cpu_meter(self, sink_pid: int) -> CpuMeter:
        """What a run of this stack costs: its processes, the sink, the shared services,
        and apart, the backends of its own database."""
        return CpuMeter(
            {**self.components, "nginx (sink)": [sink_pid]},
            services=("postgres", "beam.smp", "redis-server"),
            dynamic={OWN_BACKENDS: backend_pids(self.database)},
        )

    def __exit__(self, *_exc) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.exits.close()


def caught_up(primary: str, replica: str, timeout_s: float = 60) -> None:
    """Wait until the replica has replayed what the primary has written now (the
    migration: a process that starts earlier would find the replica unmigrated)."""
    import psycopg

    with psycopg.connect(primary, autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(replica, autocommit=True) as conn:
                if conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(target),)).fetchone()[
                    0
                ]:
                    return
        except psycopg.OperationalError:
            pass  # the database's creation not replayed yet
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: the replica did not catch up in {timeout_s:g} s")
        time.sleep(0.2)


def backend_pids(dsn: str):
    """A function listing the pids of the Postgres backends connected to dsn's
    database now (this bench's share of a Postgres server that others use too)."""
    import psycopg

    name = dsn.rsplit("/", 1)[1]

    def pids() -> list[int]:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
            ).fetchall()
        return [row[0] for row in rows]

    return pids
