"""Faults under a burst: what each one costs, on the production processes.

    python -m bench.faults [--jobs 3000] [--recurring 20] [--faults none,pg-cut,...]

For each fault, on a fresh stack (bench.common.Stack: new databases, vhost and Redis
prefix; the shipped defaults for every PUNCTUAL_* setting): two `celery -A app
worker`, one `celery -A app beat`; --jobs one-off jobs due at one instant T and
--recurring jobs every 2 s from T, all calling a local sink that records each
call's Idempotency-Key and Punctual-Attempt. The fault is injected while the burst
drains (tests/faults/injectors.py, the same faults as the fault tier), then the
bench waits for every one-off to be called and completed, and prints one row:

    lost                 one-offs never called (or not completed)
    duplicates           calls of an occurrence after its first (each must follow an expired lease)
    unexplained          duplicates that do not (must be 0)
    lease expired        runs the janitor took back ("lease expired")
    bound                what a worker killed at full speed can leave unrecorded: its
                         processes x (PUNCTUAL_DISPATCH_THREADS calls in flight + two
                         completion batches, the one written and the one gathering)
    unrecorded           lease-expired runs the target saw called (outcome never written)
    uncalled             lease-expired runs the sink never saw: claimed for their calls
                         when the worker died (taken back at once), or requests the
                         killed worker wrote that its reset connections lost before the
                         busy sink read them (calls in flight: they wait for a lease)
    taken                when the last uncalled run's lease was taken back, seconds after
                         the fault's start (within seconds; a lease is 15-27 s)
    last call            the last one-off's first call, seconds after T
    recovery             how long after the fault's end the last never-called one-off was called
    from fault           the same from the fault's start (worker-kill: from the worker's death)
    settled              when the last one-off's outcome was written, seconds after T
    gap                  the largest gap between calls of a recurring job

`--inbox postgres,webhook` runs instead one burst of --jobs one-offs per target kind
(run_inbox): the first worker is killed (kill -9) a quarter of the way through and
restarted, and at half way every connection to the postgres target's database is cut
twice; each one-off's occurrence is then counted where it landed (inbox rows, or the
nginx sink's calls): written, distinct, duplicates (beyond one each), missing.

Faults that stop or restart the machine's Postgres or RabbitMQ affect everything on
the box while they last. JSON goes to bench/results/faults-*.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path

from bench.common import Stack, machine, shown, write_result
from tests.faults import injectors

SCENARIOS = {
    "none": lambda jobs: None,
    "pg-cut": lambda jobs: injectors.cut_postgres_connections(at_s=2.4, again_after_s=3.1),
    "pg-restart": lambda jobs: injectors.restart_postgres(at_s=1.4),
    "pg-refuse": lambda jobs: injectors.refuse_connections(at_s=1.5, down_s=15.0),
    # Once a fifth of the burst is called: mid-burst, on a quiet box or a busy one.
    "worker-kill": lambda jobs: injectors.kill_worker(at_s=0.0, down_s=5.0, after_calls=jobs // 5),
    "rabbitmq-stop": lambda jobs: injectors.stop_rabbitmq(at_s=3.5, down_s=15.0),
    "beat-kill": lambda jobs: injectors.kill_beat(at_s=1.8, down_s=10.0),
    "worker-stop": lambda jobs: injectors.stop_worker(at_s=1.5, stopped_s=70.0),
    "redis-kill": lambda jobs: injectors.kill_redis_connections(at_s=1.5),
    "redis-pause": lambda jobs: injectors.pause_redis(at_s=1.5, pause_s=4.0),
    "row-locks": lambda jobs: injectors.hold_row_locks(at_s=-1.0, hold_s=8.0, rows=50),
    "two-beats": lambda jobs: injectors.second_beat(),
}
DEFAULT = ("none", "pg-cut", "pg-restart", "worker-kill", "rabbitmq-stop", "beat-kill", "worker-stop")

COLUMNS = (
    ("fault", "fault", 60),
    ("lost", "lost", 5),
    ("duplicates", "dup", 5),
    ("unexplained_duplicates", "unexpl", 6),
    ("lease_expired", "expired", 7),
    ("bound", "bound", 5),
    ("unrecorded", "unrec", 5),
    ("uncalled", "uncall", 6),
    ("uncalled_taken_s", "taken", 5),
    ("last_one_off_call_s", "last call", 9),
    ("recovery_s", "recovery", 8),
    ("from_fault_s", "from fault", 10),
    ("last_settled_s", "settled", 7),
    ("recurring_max_gap_s", "gap", 5),
)


def run_one(name: str, jobs: int, recurring: int, workers: int, env: dict[str, str]) -> dict:
    from tests.faults.harness import FaultStack, Load

    fault = SCENARIOS[name](jobs)
    with Stack(physical=1, shards=16, broker=True, env=env) as stack:
        log_dir = Path(tempfile.mkdtemp(prefix=f"punctual-faults-{name}-"))
        processes = (os.cpu_count() or 1) + 1  # celeryconfig's default
        with FaultStack(stack.env, log_dir, stack.admin, workers=workers, concurrency=processes) as fs:
            load = Load(
                one_offs=jobs,
                spread_s=0.0,
                recurring=recurring,
                every_s=2,
                lead_s=12.0,
                call_delay_s=0.0,
                timeout_s=240.0,
            )
            outcome = fs.run(load, fault)
            settings = {f.name: getattr(fs.settings, f.name) for f in dataclasses.fields(fs.settings)}
            settings.pop("database_urls", None)
        row = outcome.row()
        row["bound"] = unrecorded_bound(processes, fs.settings.dispatch_threads)
        row["scenario"] = name
        row["unexplained"] = outcome.verdict.unexplained[:20]
        row["settings"] = settings
        row["logs"] = str(log_dir)
        return row


def unrecorded_bound(processes: int, dispatch_threads: int) -> int:
    """How many calls a worker killed at full speed can leave unrecorded (docs/design.md,
    "Writes per run"): each process's calls in flight, and its completion buffer's two
    batches (app.worker.buffer: the one being written, the one gathering meanwhile)."""
    from app.worker.buffer import MAX_ITEMS

    return processes * (dispatch_threads + 2 * MAX_ITEMS)


INBOX_TARGETS = ("postgres", "webhook")
INBOX_ALIAS = "bench"
INBOX_COLUMNS = (
    ("target", "target", 8),
    ("jobs", "jobs", 5),
    ("written", "written", 7),
    ("distinct", "distinct", 8),
    ("duplicates", "dup", 5),
    ("missing", "missing", 7),
    ("retried_runs", "retried", 7),
    ("lease_expired", "expired", 7),
    ("backends_cut", "cut", 4),
    ("settled_s", "settled", 7),
)


def tally(written: Iterable[str], expected: Iterable[str]) -> dict:
    """What landed for a set of occurrences: `written` holds one key per row or call
    (an occurrence's key, repeated when it landed twice), `expected` every occurrence.
    duplicates: landings beyond one per occurrence; missing: occurrences that never
    landed; unexpected: landings of keys not expected."""
    counts = Counter(written)
    wanted = set(expected)
    return {
        "written": sum(counts.values()),
        "distinct": len(wanted & counts.keys()),
        "duplicates": sum(n - 1 for key, n in counts.items() if key in wanted),
        "missing": len(wanted - counts.keys()),
        "unexpected": sum(n for key, n in counts.items() if key not in wanted),
    }


def _wait(check: Callable[[], bool], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def run_inbox(target: str, jobs: int, workers: int, env: dict[str, str], timeout_s: float = 300.0) -> dict:
    """One burst of `jobs` one-offs due at T, all postgres targets (one alias, its own
    fresh database) or all webhooks to the nginx sink; the same two workers, beat and
    kill either way, and for postgres the target database's connections cut."""
    import sqlalchemy as sa

    from app.core.timefmt import utcnow
    from app.registry.schema import jobs as jobs_table
    from app.registry.schema import runs as runs_table
    from bench.common import PG_ADMIN, admin_engine
    from bench.nginx import NginxSink
    from tests.e2e.processes import child_env, start_beat, start_worker, wait_ready
    from tests.rows import insert_jobs, job_row, webhook_target

    admin = admin_engine()
    target_db = f"bench_inbox_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{target_db}"')
    target_dsn = sa.engine.make_url(PG_ADMIN).set(database=target_db).render_as_string(hide_password=False)
    stack_env = {
        **env,
        "PUNCTUAL_TARGET_DATABASES": f"{INBOX_ALIAS}={target_dsn}",
        "PUNCTUAL_TARGET_DATABASE_OWNERS": f"{INBOX_ALIAS}=*",
    }
    target_engine = sa.create_engine(target_dsn, poolclass=sa.pool.NullPool)
    log_dir = Path(tempfile.mkdtemp(prefix=f"punctual-faults-inbox-{target}-"))
    procs: list = []
    try:
        with Stack(physical=1, shards=16, broker=True, env=stack_env) as stack, NginxSink() as sink:
            init = subprocess.run(
                [sys.executable, "-m", "app.cli", "targets", "init", INBOX_ALIAS],
                env=child_env(stack.env),
                capture_output=True,
                text=True,
                timeout=60,
            )
            if init.returncode != 0:
                raise SystemExit(f"bench: punctual targets init failed: {init.stderr.strip()}")
            t0_at = (utcnow() + timedelta(seconds=12)).replace(microsecond=0)
            rows, ids = [], []
            for i in range(jobs):
                job_id = uuid.uuid4()
                ids.append(str(job_id))
                kind = (
                    {"type": "postgres", "database": INBOX_ALIAS}
                    if target == "postgres"
                    else webhook_target(sink.url(f"/hook/{job_id}"))
                )
                rows.append(
                    job_row(
                        stack.shards,
                        owner=stack.owner,
                        target=kind,
                        run_at=t0_at,
                        payload={"n": i},
                        name=f"inbox-{i}",
                        job_id=job_id,
                    )
                )
            insert_jobs(stack.registry, rows)
            t0 = t0_at.timestamp()

            def landed() -> list[str]:
                if target == "webhook":
                    return [a.path.rsplit("/", 1)[1] for a in sink.arrivals()]
                with target_engine.connect() as conn:
                    return [str(r[0]) for r in conn.exec_driver_sql("SELECT job_id FROM punctual_inbox")]

            def progress() -> int:
                if target == "webhook":
                    return len(sink.arrivals())
                with target_engine.connect() as conn:
                    return conn.exec_driver_sql("SELECT count(*) FROM punctual_inbox").scalar_one()

            def registry_count(query) -> int:
                total = 0
                for engine in stack.registry.engines:
                    with engine.connect() as conn:
                        total += conn.execute(query).scalar_one()
                return total

            processes = (os.cpu_count() or 1) + 1  # celeryconfig's default
            fleet = [
                start_worker(stack.env, log_dir, name=f"worker{i}", concurrency=processes)
                for i in range(workers)
            ]
            procs += fleet
            procs.append(start_beat(stack.env, log_dir))
            for proc in procs:
                wait_ready(proc, 0.5)
            deadline = time.monotonic() + timeout_s
            events: dict[str, float | int | None] = {"kill_s": None, "restart_s": None, "cut_s": None}
            if _wait(lambda: progress() >= jobs // 4, deadline):
                fleet[0].kill()
                events["kill_s"] = round(time.time() - t0, 1)
                time.sleep(5.0)  # as the fault tier's worker kill: restarted 5 s later
                heir = start_worker(stack.env, log_dir, name="worker0-heir", concurrency=processes)
                procs.append(heir)
                events["restart_s"] = round(time.time() - t0, 1)
            cut = 0
            if target == "postgres" and _wait(lambda: progress() >= jobs // 2, deadline):
                events["cut_s"] = round(time.time() - t0, 1)
                for again in (False, True):
                    if again:
                        time.sleep(3.0)
                    with admin.connect() as conn:
                        cut += conn.exec_driver_sql(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            f"WHERE datname = '{target_db}' AND pid <> pg_backend_pid()"
                        ).scalar_one()
            open_jobs = sa.select(sa.func.count()).where(
                jobs_table.c.owner == stack.owner, jobs_table.c.state != "completed"
            )
            settled = _wait(lambda: registry_count(open_jobs) == 0, deadline)
            settled_s = round(time.time() - t0, 1) if settled else None
            time.sleep(1.0)  # a late duplicate arrives now or never (the sink flushes every 250 ms)
            counted = tally(landed(), ids)
            mine = runs_table.c.owner == stack.owner
            retried = registry_count(sa.select(sa.func.count()).where(mine, runs_table.c.attempt > 1))
            expired = registry_count(
                sa.select(sa.func.count()).where(mine, runs_table.c.error.like("lease expired%"))
            )
            settings = {
                k: v
                for k, v in dataclasses.asdict(stack.settings).items()
                if k not in ("database_urls", "target_databases")
            }
            for proc in procs:
                proc.stop(0)
            return {
                "fault": f"inbox-{target}",
                "target": target,
                "jobs": jobs,
                **counted,
                "retried_runs": retried,
                "lease_expired": expired,
                "backends_cut": cut if target == "postgres" else "n/a",
                "settled": settled,
                "settled_s": settled_s,
                **events,
                "settings": settings,
                "logs": str(log_dir),
            }
    finally:
        for proc in procs:
            proc.stop(0)
        target_engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{target_db}" WITH (FORCE)')
        admin.dispose()


def print_row(row: dict, columns: tuple) -> None:
    print(
        "  ".join(
            f"{str(row[key]):>{width}}" if key != "fault" else f"{str(row[key])[:width]:<{width}}"
            for key, _, width in columns
        ),
        flush=True,
    )


def print_head(columns: tuple) -> None:
    print(
        "  ".join(
            f"{title:>{width}}" if key != "fault" else f"{title:<{width}}" for key, title, width in columns
        )
    )


def inbox_markdown(rows: list[dict]) -> str:
    lines = [
        "| target | jobs | written | distinct | duplicates | missing | runs retried "
        '| runs failed "lease expired" | target backends cut | settled |',
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['jobs']} | {r['written']} | {r['distinct']} | {r['duplicates']} "
            f"| {r['missing']} | {r['retried_runs']} | {r['lease_expired']} | {r['backends_cut']} "
            f"| T+{r['settled_s']} s |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    head = (
        "| fault | lost | duplicate calls (after an expired lease) | unexplained "
        '| runs failed "lease expired" | unrecorded bound | unrecorded | uncalled '
        "| uncalled taken back | last one-off call | recovery | from fault | settled "
        "| largest recurring gap |"
    )
    lines = [head, "| --- |" + " ---: |" * 13]
    for r in rows:
        lines.append(
            f"| {r['fault']} | {r['lost']} | {r['duplicates']} | {r['unexplained_duplicates']} "
            f"| {r['lease_expired']} | {r['bound']} | {r['unrecorded']} | {r['uncalled']} "
            f"| {r.get('uncalled_taken_s')} s | T+{r['last_one_off_call_s']} s | {r['recovery_s']} s "
            f"| {r.get('from_fault_s', '')} s "
            f"| T+{r['last_settled_s']} s | {r['recurring_max_gap_s']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="one-off jobs due at T")
    parser.add_argument("--recurring", type=int, default=20, help="jobs every 2 s from T")
    parser.add_argument("--workers", type=int, default=2, help="`celery -A app worker` processes")
    parser.add_argument(
        "--faults", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=V",
        help="a setting other than the shipped default (recorded in the JSON)",
    )
    parser.add_argument("--label", default="")
    parser.add_argument(
        "--inbox",
        default="",
        metavar="postgres,webhook",
        help="instead of --faults: one burst per target kind, a worker killed and the target cut",
    )
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    if args.inbox:
        targets = [t.strip() for t in args.inbox.split(",") if t.strip()]
        bad = [t for t in targets if t not in INBOX_TARGETS]
        if bad:
            parser.error(f"unknown --inbox target {bad[0]!r}; one of {', '.join(INBOX_TARGETS)}")
        print_head(INBOX_COLUMNS)
        rows = []
        for target in targets:
            rows.append(run_inbox(target, args.jobs, args.workers, env))
            print_row(rows[-1], INBOX_COLUMNS)
        table = inbox_markdown(rows)
    else:
        names = [n.strip() for n in args.faults.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown fault {unknown[0]!r}; one of {', '.join(SCENARIOS)}")
        print_head(COLUMNS)
        rows = []
        for name in names:
            rows.append(run_one(name, args.jobs, args.recurring, args.workers, env))
            print_row(rows[-1], COLUMNS)
        table = markdown(rows)
    result = {
        "jobs": args.jobs,
        "recurring": 0 if args.inbox else args.recurring,
        "workers": args.workers,
        "env_overrides": env,
        "rows": rows,
        "machine": {**machine(), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    label = "-".join(x for x in ("inbox" if args.inbox else "", args.label) if x)
    path = write_result("faults", result, label)
    print()
    print(table)
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
