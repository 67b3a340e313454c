"""A shard move under fire: how long `punctual shards move` takes and the longest start
gap of a job every second on the moving shard.

    python -m bench.move [--jobs 1000000] [--runs 0] [--shard 1]

Two fresh databases (16 logical shards) with one worker and one beat; --jobs
one-off jobs far in the future and --runs finished runs are written straight into
logical shard --shard; an interval job every 1 s on that shard calls a local sink.
A third database is added at the end (`punctual migrate` stamps it), the processes
are started with all three DSNs, and `punctual shards move SHARD --to 2` runs as an
operator would run it. Printed and written to bench/results/: the move's duration,
its fence, and the longest gap between two calls of the 1 s job from 5 s before the
move until 5 s after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import subprocess
import sys
import time
import uuid

from bench.common import PG_ADMIN, Stack, machine, shown, write_result

BULK_JOBS = """
INSERT INTO jobs (job_id, shard, owner, name, target, payload, schedule_kind, run_at, timezone,
                  retry_max_attempts, retry_backoff_s, retry_max_backoff_s, misfire, dst_gap, dst_overlap,
                  jitter_s, state, next_run_at, nominal_at, attempt, misfire_exempt, created_at, updated_at)
SELECT gen_random_uuid(), %(shard)s, 'bench', 'bulk-' || n,
       '{"type": "webhook", "url": "http://127.0.0.1:9/", "method": "POST", "headers": {}, "timeout_s": 30}',
       jsonb_build_object('n', n), 'once', now() + interval '30 days', 'UTC', 5, 10, 3600, 'run_once',
       'shift', 'once', 0, 'scheduled', now() + interval '30 days', now() + interval '30 days', 0, false,
       now(), now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""
BULK_RUNS = """
INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state, published, target,
                  retry, started_at, finished_at, lateness_ms, status_code, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), %(shard)s, 'bench', 'schedule', now() - interval '1 day', 1,
       'succeeded', true, '{"type": "webhook", "url": "http://127.0.0.1:9/"}', '{}', now() - interval '1 day',
       now() - interval '1 day', 5, 200, now() - interval '1 day', now() - interval '1 day'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""


def fill(dsn: str, shard: int, jobs: int, runs: int) -> float:
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement, total in ((BULK_JOBS, jobs), (BULK_RUNS, runs)):
            for first in range(1, total + 1, 100_000):
                conn.execute(statement, {"shard": shard, "first": first, "last": min(total, first + 99_999)})
        conn.execute("ANALYZE jobs")
        conn.execute("ANALYZE runs")
    return time.monotonic() - started


def bytes_per_row(dsn: str, table: str, rows: int) -> int | None:
    """The table's size with its indexes and TOAST, per row (the shard is alone on it)."""
    import psycopg

    if not rows:
        return None
    with psycopg.connect(dsn, autocommit=True) as conn:
        return round(conn.execute(f"SELECT pg_total_relation_size('{table}')").fetchone()[0] / rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs on the moving shard")
    parser.add_argument("--runs", type=int, default=0, help="finished runs (history) on the moving shard")
    parser.add_argument("--shard", type=int, default=1, help="the logical shard that moves")
    args = parser.parse_args()

    import sqlalchemy as sa

    from app.core.timefmt import utcnow
    from app.registry.engines import Registry
    from app.registry.migrate import migrate_all
    from app.registry.sharding import shard_for
    from app.services.idempotency import job_id_for
    from app.services.jobs import create_job
    from app.settings import Settings
    from bench.sink import FastSink

    load_before = os.getloadavg()
    sink = FastSink(record=True)
    with Stack(physical=2, shards=16, broker=True, env={"PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1"}) as stack:
        source_index = args.shard % 2
        fill_s = fill(stack.dsns[source_index], args.shard, args.jobs, args.runs)
        sizes = {
            "job_bytes_per_row": bytes_per_row(stack.dsns[source_index], "jobs", args.jobs),
            "run_bytes_per_row": bytes_per_row(stack.dsns[source_index], "runs", args.runs),
        }
        third = f"bench_{uuid.uuid4().hex[:10]}"
        with stack.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{third}"')
        stack.databases.append(third)
        added = sa.engine.make_url(PG_ADMIN).set(database=third).render_as_string(hide_password=False)
        dsns = (*stack.dsns, added)
        migrate_all(dsns, shards=16)
        stack.env["PUNCTUAL_DATABASE_URLS"] = ",".join(dsns)
        settings = Settings.from_env(stack.env)
        registry = Registry(settings)
        key = next(
            k
            for k in (f"tick-{n}" for n in range(10_000))
            if shard_for(job_id_for(stack.owner, k), 16) == args.shard
        )
        tick = create_job(
            registry,
            stack.owner,
            {
                "name": "every-second",
                "target": {"type": "webhook", "url": sink.url("/tick")},
                "schedule": {"interval_s": 1},
            },
            key,
            utcnow(),
        ).job
        stack.start_workers(1, 2)
        stack.start_beat()
        sink.wait_for(5, timeout_s=60)
        started = time.time()
        command = [sys.executable, "-m", "app.cli", "shards", "move", str(args.shard), "--to", "2"]
        moved = subprocess.run(command, env={**os.environ, **stack.env}, capture_output=True, text=True)
        ended = time.time()
        if moved.returncode != 0:
            raise SystemExit(f"bench.move: the move failed:\n{moved.stderr}")
        time.sleep(6)
        arrivals = sorted(at for at, _key in sink.arrivals())
        window = [at for at in arrivals if started - 5 <= at <= ended + 5]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        fence = re.search(r"fence of ([\d.]+) s", moved.stdout)
        result = {
            "jobs_on_shard": args.jobs,
            "runs_on_shard": args.runs,
            "shard": args.shard,
            "fill_s": round(fill_s, 1),
            **sizes,
            "move_s": round(ended - started, 2),
            "fence_s": float(fence.group(1)) if fence else None,
            "longest_start_gap_s": round(max(gaps), 3) if gaps else None,
            "calls_of_the_1s_job_in_window": len(window),
            "window_s": round(ended - started + 10, 1),
            "move_output": moved.stdout.strip().splitlines(),
            "settings": {k: str(v) for k, v in dataclasses.asdict(settings).items() if k != "database_urls"},
            "interval_job": str(tick["job_id"]),
            "machine": {
                **machine(),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            },
        }
        registry.dispose()
    sink.close()
    path = write_result("move", result, label=str(args.jobs))
    print(
        f"moved a shard of {args.jobs:,} jobs and {args.runs:,} runs in {result['move_s']} s "
        f"(fence {result['fence_s']} s); longest gap between calls of the 1 s job: "
        f"{result['longest_start_gap_s']} s -> {shown(path)}"
    )


if __name__ == "__main__":
    main()
