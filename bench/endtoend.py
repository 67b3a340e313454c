"""End-to-end starts/s: N jobs due at one instant, fired by real Punctual processes.

    python -m bench.endtoend --jobs 10000

Makes a fresh Postgres database, RabbitMQ vhost and Redis prefix; inserts N one-off
webhook jobs all due at the same instant a few seconds ahead (straight into the
registry, as the API would write them); starts `celery -A app beat` and `celery -A
app worker` (prefork) as subprocesses; a local HTTP sink (bench/sink.py, its own
process) answers 200 to every call. Everything shares this machine.

Figures: starts/s = N / (last run's started_at - the due instant), the same for
calls received by the sink, and start lateness percentiles (started_at -
scheduled_for, the API's lateness_ms). The JSON goes to bench/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

RESULTS = Path(__file__).resolve().parent / "results"
PG_ADMIN = os.environ.get("PUNCTUAL_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")
AMQP_BASE = os.environ.get("PUNCTUAL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")
REDIS_URL = os.environ.get("PUNCTUAL_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _admin_engine():
    from app.registry import engine_url

    return sa.create_engine(engine_url(PG_ADMIN), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(jobs: int, workers: int, concurrency: int, shards: int, poll_interval_s: float, lead_s: float,
        timeout_s: float, threads: int) -> dict:
    from app.migrate import migrate_all
    from app.registry import registry_for
    from app.owners import create_key
    from app.schema import runs
    from app.settings import Settings
    from tests.e2e.processes import start_beat, start_worker, wait_ready
    from tests.rows import insert_jobs, job_row, webhook_target
    from bench.sink import FastSink
    from app.timefmt import utcnow

    load_before = os.getloadavg()  # the box is shared: say how busy it was
    name = f"bench_{uuid.uuid4().hex[:10]}"
    vhost = name
    prefix = f"pt-bench-{uuid.uuid4().hex[:8]}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    dsn = sa.engine.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
    subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
                   check=True, capture_output=True)
    sink = FastSink()
    procs = []
    env = {
        "PUNCTUAL_DATABASE_URLS": dsn,
        "PUNCTUAL_BROKER_URL": f"{AMQP_BASE}/{vhost}",
        "PUNCTUAL_REDIS_URL": REDIS_URL,
        "PUNCTUAL_REDIS_PREFIX": prefix,
        "PUNCTUAL_SHARDS": str(shards),
        "PUNCTUAL_POLL_INTERVAL_S": str(poll_interval_s),
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_TARGET_MAX_CONCURRENCY": "0",
        "PUNCTUAL_DISPATCH_THREADS": str(threads),
    }
    try:
        migrate_all((dsn,))
        settings = Settings.from_env(env)
        registry = registry_for(settings)
        create_key(registry, "bench")
        log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-"))
        procs = [start_worker(env, log_dir, name=f"w{i}", concurrency=concurrency) for i in range(workers)]
        procs.append(start_beat(env, log_dir))
        for proc in procs:
            wait_ready(proc, 0.5)
        due = utcnow() + timedelta(seconds=lead_s)
        target = webhook_target(sink.url("/bench"))
        rows = [job_row(shards, owner="bench", run_at=due, target=target, payload={"n": i}) for i in range(jobs)]
        insert_jobs(registry, rows)
        if utcnow() >= due:
            raise RuntimeError(f"inserting {jobs} jobs took longer than --lead-s {lead_s}; raise it")
        sink.wait_for(jobs, timeout_s=lead_s + timeout_s)
        calls_done = time.time()
        with registry.engines[0].connect() as conn:
            started = conn.execute(sa.select(runs.c.started_at, runs.c.lateness_ms).where(runs.c.started_at.isnot(None))).all()
            # When the claims committed (created_at) and the completions were written.
            claimed_last, finished_last = conn.execute(sa.select(sa.func.max(runs.c.created_at), sa.func.max(runs.c.finished_at))).one()
        last_start = max(r.started_at for r in started)
        lateness_s = [r.lateness_ms / 1000 for r in started]
        start_window_s = (last_start - due).total_seconds()
        call_window_s = calls_done - due.timestamp()
        return {
            "bench": "endtoend",
            "jobs": jobs,
            "runs_started": len(started),
            "starts_per_s": round(len(started) / start_window_s, 1),
            "calls_per_s": round(jobs / call_window_s, 1),
            "last_start_after_due_s": round(start_window_s, 3),
            "last_call_after_due_s": round(call_window_s, 3),
            "last_claim_after_due_s": round((claimed_last - due).total_seconds(), 3),
            "last_completion_after_due_s": round((finished_last - due).total_seconds(), 3) if finished_last else None,
            "lateness_p50_s": round(_percentile(lateness_s, 0.5), 3),
            "lateness_p99_s": round(_percentile(lateness_s, 0.99), 3),
            "lateness_max_s": round(max(lateness_s), 3),
            "config": {"workers": workers, "processes_per_worker": concurrency, "dispatch_threads": threads,
                       "shards": shards, "poll_interval_s": poll_interval_s, "physical_dsns": 1},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_average_before": [round(x, 2) for x in load_before],
                        "load_average_after": [round(x, 2) for x in os.getloadavg()]},
            "at": utcnow().isoformat(),
        }
    finally:
        for proc in procs:
            proc.stop()
        sink.close()
        from app.registry import _registries

        for key in list(_registries):
            _registries.pop(key).dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (celery -A app worker)")
    parser.add_argument("--concurrency", type=int, default=(os.cpu_count() or 1) + 1,
                        help="prefork processes per worker (default: celeryconfig's, cores + 1)")
    parser.add_argument("--threads", type=int, default=256, help="PUNCTUAL_DISPATCH_THREADS")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--poll-interval-s", type=float, default=1.0, help="PUNCTUAL_POLL_INTERVAL_S (its default)")
    parser.add_argument("--lead-s", type=float, default=8.0, help="how far ahead the jobs are due")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    result = run(args.jobs, args.workers, args.concurrency, args.shards, args.poll_interval_s, args.lead_s,
                 args.timeout_s, args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"endtoend-{args.jobs}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for key in ("jobs", "runs_started", "starts_per_s", "calls_per_s", "last_start_after_due_s",
                "last_call_after_due_s", "last_claim_after_due_s", "last_completion_after_due_s", "lateness_p50_s", "lateness_p99_s", "lateness_max_s"):
        print(f"{key:24} {result[key]}")
    print(f"{'load average before':24} {result['machine']['load_average_before']}")
    print(f"written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
