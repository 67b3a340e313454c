"""Faults, injected into the machine's real services and Punctual's real processes.

Each fault is a `Fault`: `inject(stack)` breaks something, `heal(stack)` repairs it
and waits until it answers again. Faults on the shared services (Postgres restart,
RabbitMQ stop, Redis pause) affect every user of the box for their duration, so they
are short and always healed (`heal` runs in a `finally`). Connection kills are aimed
at this stack's own connections only: Postgres backends of its databases, Redis
clients whose local port belongs to one of its processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # still coming back
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come back within {timeout_s:g}s")
        time.sleep(every_s)


def _quiet(argv: list[str], timeout_s: float = 60) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Fault:
    name: str
    at_s: float  # injected this long after T (the burst's instant)
    hold_s: float  # how long it lasts before heal
    inject: Callable = field(repr=False)
    heal: Callable = field(repr=False, default=lambda stack: None)
    # A fault that happens twice (two connection cuts) injects again this long later.
    again_after_s: float | None = None
    # Injected only once the sink has seen this many one-off calls too (mid-burst on a
    # box of any speed), at most 30 s after `at_s`.
    after_calls: int = 0


# -- Punctual's processes ---------------------------------------------------------------


def kill_worker(at_s: float = 1.0, down_s: float = 5.0, index: int = 0, after_calls: int = 0) -> Fault:
    """kill -9 of a worker's process group (parent and prefork children), restarted later."""
    return Fault(
        f"worker {index} killed (kill -9), restarted {down_s:g}s later",
        at_s,
        down_s,
        inject=lambda stack: stack.workers[index].kill(),
        heal=lambda stack: stack.restart_worker(index),
        after_calls=after_calls,
    )


def kill_worker_for_good(at_s: float = 1.0, index: int = 0, after_calls: int = 0) -> Fault:
    """kill -9 of a worker's process group, not restarted: the other workers serve its
    queues (the fault's end is its death)."""
    return Fault(
        f"worker {index} killed (kill -9), not restarted",
        at_s,
        0.0,
        inject=lambda stack: stack.workers[index].kill(),
        after_calls=after_calls,
    )


def kill_beat(at_s: float = 1.0, down_s: float = 8.0) -> Fault:
    return Fault(
        f"beat killed (kill -9), restarted {down_s:g}s later",
        at_s,
        down_s,
        inject=lambda stack: stack.beat.kill(),
        heal=lambda stack: stack.restart_beat(),
    )


def kill_api(at_s: float = 1.0, down_s: float = 2.0) -> Fault:
    return Fault(
        f"API killed (kill -9), restarted {down_s:g}s later",
        at_s,
        down_s,
        inject=lambda stack: stack.api.kill(),
        heal=lambda stack: stack.restart_api(),
    )


def stop_worker(at_s: float = 1.0, stopped_s: float = 30.0, index: int = 0) -> Fault:
    """SIGSTOP of one worker's process group (the other keeps running), SIGCONT later."""

    def send(sig):
        def act(stack):
            os.killpg(stack.workers[index].pid, sig)

        return act

    return Fault(
        f"worker {index} stopped (SIGSTOP) for {stopped_s:g}s",
        at_s,
        stopped_s,
        inject=send(signal.SIGSTOP),
        heal=send(signal.SIGCONT),
    )


def second_beat(at_s: float = -3.0, hold_s: float = 10.0) -> Fault:
    return Fault("two beats", at_s, hold_s, inject=lambda stack: stack.add_beat(), heal=lambda stack: None)


# -- PostgreSQL ---------------------------------------------------------------------------


def terminate_backends(stack) -> int:
    """pg_terminate_backend of every connection to this stack's databases."""
    names = [sa.engine.make_url(dsn).database for dsn in stack.settings.database_urls]
    with stack.pg_admin.connect() as conn:
        return len(
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = ANY(:names) AND pid <> pg_backend_pid()"
                ),
                {"names": names},
            ).all()
        )


def cut_postgres_connections(at_s: float = 1.5, again_after_s: float = 3.0) -> Fault:
    return Fault(
        "Postgres connections cut (pg_terminate_backend), twice",
        at_s,
        0.0,
        inject=terminate_backends,
        again_after_s=again_after_s,
    )


def refuse_connections(at_s: float = 1.5, down_s: float = 15.0) -> Fault:
    """This stack's databases refuse every connection for longer than a write is
    retried (ALLOW_CONNECTIONS false, and every connection cut): dispatch tasks give
    their messages back, and the runs start once the databases answer again. Other
    users of the machine's Postgres see nothing."""

    def names(stack) -> list[str]:
        return [sa.engine.make_url(dsn).database for dsn in stack.settings.database_urls]

    def inject(stack):
        with stack.pg_admin.connect() as conn:
            for name in names(stack):
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        terminate_backends(stack)

    def heal(stack):
        with stack.pg_admin.connect() as conn:
            for name in names(stack):
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    return Fault(
        f"this stack's databases refuse connections for {down_s:g}s", at_s, down_s, inject=inject, heal=heal
    )


def postgres_cluster() -> str:
    versions = sorted(os.listdir("/etc/postgresql"))
    return versions[-1]


def _pg_ready() -> bool:
    return _quiet(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"], 5)


def restart_postgres(at_s: float = 1.5) -> Fault:
    """`pg_ctlcluster ... main restart` (the machine's service command), then wait for it."""

    def inject(stack):
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", postgres_cluster(), "main", "restart"],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def heal(stack):
        wait_until(_pg_ready, 60, "PostgreSQL")

    return Fault("Postgres restarted (pg_ctlcluster restart)", at_s, 0.0, inject=inject, heal=heal)


def hold_row_locks(at_s: float = -1.0, hold_s: float = 8.0, rows: int = 20) -> Fault:
    """A transaction holds FOR UPDATE locks on some of the burst's job rows (claimed
    ahead by then, so the start, the heartbeat and the completion meet them)."""
    held = {}

    def inject(stack):
        engine = stack.registry.engine_for_shard(0)
        conn = engine.connect()
        trans = conn.begin()
        ids = [j for j in stack.one_off_ids if stack.shard_of(j) % len(stack.registry.engines) == 0][:rows]
        conn.execute(
            sa.text("SELECT job_id FROM jobs WHERE job_id = ANY(:ids) ORDER BY job_id FOR UPDATE"),
            {"ids": ids},
        ).all()
        held.update(conn=conn, trans=trans)

    def heal(stack):
        held["trans"].rollback()
        held["conn"].close()

    return Fault(f"row locks on {rows} jobs held for {hold_s:g}s", at_s, hold_s, inject=inject, heal=heal)


# -- RabbitMQ -----------------------------------------------------------------------------


def _rabbit_up() -> bool:
    return _quiet(["rabbitmqctl", "-q", "await_startup", "--timeout", "5"], 10)


def stop_rabbitmq(at_s: float = 2.0, down_s: float = 8.0) -> Fault:
    def inject(stack):
        subprocess.run(["rabbitmqctl", "-q", "stop_app"], check=True, capture_output=True, timeout=60)

    def heal(stack):
        subprocess.run(["rabbitmqctl", "-q", "start_app"], check=True, capture_output=True, timeout=120)
        wait_until(_rabbit_up, 60, "RabbitMQ")

    return Fault(
        f"RabbitMQ stopped for {down_s:g}s (stop_app / start_app)", at_s, down_s, inject=inject, heal=heal
    )


# -- Redis --------------------------------------------------------------------------------


def _redis(*args: str) -> str:
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", "6379", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout


def _descendants(roots: list[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def kill_redis_clients(stack) -> int:
    """CLIENT KILL of every Redis connection opened by this stack's processes."""
    pids = _descendants([proc.pid for proc in stack.processes()])
    out = subprocess.run(["ss", "-tnpH", "dst", "127.0.0.1:6379"], capture_output=True, text=True).stdout
    killed = 0
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            local = line.split()[3]
            try:
                killed += int(_redis("CLIENT", "KILL", "ADDR", local).strip() == "OK")
            except subprocess.CalledProcessError:
                pass
    return killed


def kill_redis_connections(at_s: float = 1.5, again_after_s: float = 2.0) -> Fault:
    return Fault(
        "Redis connections killed (CLIENT KILL), twice",
        at_s,
        0.0,
        inject=kill_redis_clients,
        again_after_s=again_after_s,
    )


def pause_redis(at_s: float = 1.5, pause_s: float = 4.0) -> Fault:
    """CLIENT PAUSE (every client of the box waits, for a few seconds only)."""
    return Fault(
        f"Redis paused (CLIENT PAUSE) for {pause_s:g}s",
        at_s,
        pause_s,
        inject=lambda stack: _redis("CLIENT", "PAUSE", str(int(pause_s * 1000)), "ALL"),
        heal=lambda stack: _redis("CLIENT", "UNPAUSE"),
    )


# -- the network ----------------------------------------------------------------------------


def partition_worker(at_s: float = 1.5, cut_s: float = 30.0) -> Fault:
    """Worker 0 (in its own network namespace) cut off from Postgres, RabbitMQ, Redis
    and the target: the link drops every packet, nothing is reset."""
    return Fault(
        f"worker 0 cut off from the network for {cut_s:g}s",
        at_s,
        cut_s,
        inject=lambda stack: stack.partition.cut(),
        heal=lambda stack: stack.partition.mend(),
    )
