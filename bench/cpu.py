"""CPU seconds per component, read from /proc/<pid>/stat of each process tree.

A component is a list of root pids (a Celery worker, the API's gunicorn master,
the Postgres postmaster...). Its CPU is utime + stime of every live process below
the roots plus cutime + cstime (children that exited and were waited for), so a
prefork child or a gunicorn worker that was replaced still counts. Two snapshots
make a window: `CpuMeter.start()` and `CpuMeter.stop()`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")

OWN_BACKENDS = "postgres (this database's backends)"  # a part of SERVER_POSTGRES


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    comm: str
    ticks: int  # utime + stime + cutime + cstime


def parse_stat(text: str) -> ProcStat:
    """One /proc/<pid>/stat line. The command name sits in parentheses and may itself
    hold spaces and parentheses, so the fields after it are found from the last ')'."""
    open_at, close_at = text.index("("), text.rindex(")")
    fields = text[close_at + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14-17.
    return ProcStat(
        pid=int(text[:open_at]),
        ppid=int(fields[1]),
        comm=text[open_at + 1 : close_at],
        ticks=sum(int(f) for f in fields[11:15]),
    )


def proc_table(proc: Path = Path("/proc")) -> dict[int, ProcStat]:
    table = {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                stat = parse_stat((proc / entry / "stat").read_text())
            except (OSError, ValueError):
                continue  # exited meanwhile
            table[stat.pid] = stat
    return table


def tree_ticks(table: dict[int, ProcStat], roots: list[int]) -> int:
    """Ticks of the roots and all their descendants in `table` (each process once)."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    seen: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return sum(table[pid].ticks for pid in seen)


def server_roots(table: dict[int, ProcStat], comm: str) -> list[int]:
    """The top processes named `comm` (a server's master, not its children)."""
    return sorted(
        s.pid
        for s in table.values()
        if s.comm == comm and (s.ppid not in table or table[s.ppid].comm != comm)
    )


def cpu_delta_s(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    return {name: round((after[name] - before.get(name, 0)) / TICKS_PER_S, 2) for name in after}


def per_run_ms(cpu_s: dict[str, float], runs: int, not_in_total: tuple[str, ...] = ()) -> dict[str, float]:
    """CPU-ms per run of each component, and their total without `not_in_total` (the
    parts of a component counted again on their own)."""
    figures = {name: round(1000 * seconds / max(1, runs), 3) for name, seconds in cpu_s.items()}
    total = sum(seconds for name, seconds in cpu_s.items() if name not in not_in_total)
    figures["total"] = round(1000 * total / max(1, runs), 3)
    return figures


# The shared services on this box, by process name, and how they are reported.
SERVICES = {"postgres": "postgres (server)", "beam.smp": "rabbitmq (beam.smp)", "redis-server": "redis"}

OWN_TOTAL = "total, postgres as this database's backends"


def with_own_total(cpu_ms: dict[str, float]) -> dict[str, float]:
    """per_run_ms' figures plus OWN_TOTAL: the total with only this run's share of the
    shared Postgres server (its database's backends), when both were read."""
    server = SERVICES["postgres"]
    if OWN_BACKENDS in cpu_ms and server in cpu_ms:
        cpu_ms[OWN_TOTAL] = round(cpu_ms["total"] - cpu_ms[server] + cpu_ms[OWN_BACKENDS], 3)
    return cpu_ms


class CpuMeter:
    """CPU of named components between start() and stop(). `components` maps a name
    to root pids; `services` adds the shared servers' whole process trees, found by
    name when start() runs; `dynamic` maps a name to a function that lists pids now
    (such as one database's Postgres backends): it is asked at start() and at stop(),
    and a pid that only the second answer holds counts from zero."""

    def __init__(
        self,
        components: dict[str, list[int]],
        services: tuple[str, ...] = (),
        dynamic: dict[str, Callable[[], list[int]]] | None = None,
    ):
        self.components = dict(components)
        self.services = services
        self.dynamic = dict(dynamic or {})
        self.first_pids: dict[str, list[int]] = {}
        self.before: dict[str, int] = {}
        self.table_before: dict[int, ProcStat] = {}

    def start(self) -> None:
        table = proc_table()
        for comm in self.services:
            self.components[SERVICES[comm]] = server_roots(table, comm)
        self.first_pids = {name: list(pids()) for name, pids in self.dynamic.items()}
        self.table_before = table
        self.before = {name: tree_ticks(table, roots) for name, roots in self.components.items()}

    def stop(self) -> dict[str, float]:
        last_pids = {name: list(pids()) for name, pids in self.dynamic.items()}
        table = proc_table()
        before, after = (
            dict(self.before),
            {name: tree_ticks(table, roots) for name, roots in self.components.items()},
        )
        for name in self.dynamic:
            pids = sorted(set(self.first_pids[name]) | set(last_pids[name]))
            before[name] = sum(self.table_before[p].ticks for p in pids if p in self.table_before)
            after[name] = sum(table[p].ticks for p in pids if p in table)
        return cpu_delta_s(before, after)
