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
import os
import time
from datetime import timedelta

import sqlalchemy as sa

from bench.common import Stack, machine, percentile, shown, write_result


def run(jobs: int, workers: int, concurrency: int, shards: int, poll_interval_s: float, lead_s: float,
        timeout_s: float, threads: int) -> dict:
    from app.registry.schema import runs
    from app.core.timefmt import utcnow
    from bench.sink import FastSink
    from tests.rows import insert_jobs, job_row, webhook_target

    load_before = os.getloadavg()  # the box is shared: say how busy it was
    sink = FastSink()  # forked before any thread or connection
    env = {"PUNCTUAL_POLL_INTERVAL_S": str(poll_interval_s), "PUNCTUAL_TARGET_MAX_CONCURRENCY": "0",
           "PUNCTUAL_DISPATCH_THREADS": str(threads)}
    try:
        with Stack(physical=1, shards=shards, broker=True, env=env) as stack:
            stack.start_workers(workers, concurrency)
            stack.start_beat()
            registry = stack.registry
            due = utcnow() + timedelta(seconds=lead_s)
            target = webhook_target(sink.url("/bench"))
            rows = [job_row(shards, owner=stack.owner, run_at=due, target=target, payload={"n": i}) for i in range(jobs)]
            insert_jobs(registry, rows)
            if utcnow() >= due:
                raise RuntimeError(f"inserting {jobs} jobs took longer than --lead-s {lead_s}; raise it")
            sink.wait_for(jobs, timeout_s=lead_s + timeout_s)
            calls_done = time.time()
            with registry.engines[0].connect() as conn:
                started = conn.execute(sa.select(runs.c.started_at, runs.c.lateness_ms).where(runs.c.started_at.isnot(None))).all()
                # When the claims committed (created_at) and the completions were written.
                claimed_last, finished_last = conn.execute(sa.select(sa.func.max(runs.c.created_at), sa.func.max(runs.c.finished_at))).one()
    finally:
        sink.close()
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
        "lateness_p50_s": round(percentile(lateness_s, 0.5), 3),
        "lateness_p99_s": round(percentile(lateness_s, 0.99), 3),
        "lateness_max_s": round(max(lateness_s), 3),
        "config": {"workers": workers, "processes_per_worker": concurrency, "dispatch_threads": threads,
                   "shards": shards, "poll_interval_s": poll_interval_s, "physical_dsns": 1},
        "machine": {**machine(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "at": utcnow().isoformat(),
    }


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
    path = write_result("endtoend", result, str(args.jobs))
    for key in ("jobs", "runs_started", "starts_per_s", "calls_per_s", "last_start_after_due_s",
                "last_call_after_due_s", "last_claim_after_due_s", "last_completion_after_due_s", "lateness_p50_s", "lateness_p99_s", "lateness_max_s"):
        print(f"{key:24} {result[key]}")
    print(f"{'load average before':24} {result['machine']['load_average_before']}")
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
