"""The worker's engine alone: what one process spends per run from message to record.

    python -m bench.dispatch [--runs 10000] [--rounds 3] [--default-cap 200,0] [--set PUNCTUAL_X=Y]

One fresh Postgres database (16 logical shards), a fresh Redis key prefix and a
local nginx sink (bench/nginx.py). Each measurement inserts --runs one-off webhook
jobs, all due, each to its own path on the sink, claims them all with the claim a
poll tick runs (untimed), and cuts them into dispatch messages of 100 runs, as the
claim's relay does. Then, timed, one worker engine (app.worker.context, as a pool
process of `celery -A app worker` holds it) is handed the messages one after
another, as a process with prefetch 1 takes them: dispatch (admission, fenced
start), the calls on its event loop (each concurrency slot taken right before its
call), the completions written in batches. The clock stops when the last outcome
is recorded.

What it leaves out, the burst measures (bench.burst): the claim and its publish,
Celery and the broker, several processes sharing two cores. What it keeps is the
path that costs the most Python per run, measured without their noise: the
figures are this process's CPU per run (every thread: time.process_time), the CPU
of the database's backends and of Redis, and runs per second of one process.

The settings are the shipped defaults but the registry, Redis and
PUNCTUAL_ALLOW_PRIVATE_TARGETS=1 (the sink is on 127.0.0.1); --default-cap
alternates PUNCTUAL_TARGET_MAX_CONCURRENCY values, measurement by measurement, and
--set overrides one setting for all of them. JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta
from statistics import median

from bench.common import Stack, machine, shown, write_result
from bench.cpu import CpuMeter
from bench.nginx import NginxSink
from bench.stack import REDIS_URL, backend_pids, effective_settings, fresh_redis_prefix, parse_overrides

MESSAGE_RUNS = 100


def _claim_all(stack: Stack) -> list:
    from app.core.timefmt import utcnow
    from app.pollers.claim import claim_batch

    runs = []
    for shard in range(stack.settings.shards):
        engine = stack.registry.engine_for_shard(shard)
        while True:
            result = claim_batch(engine, shard, utcnow(), stack.settings)
            runs += result.runs
            if result.empty:
                break
    return runs


def _recorded(stack: Stack) -> dict[str, int]:
    import sqlalchemy as sa

    with stack.registry.engines[0].connect() as conn:
        return dict(conn.execute(sa.text("SELECT state, count(*) FROM runs GROUP BY state")).all())


def measure(stack: Stack, sink: NginxSink, runs: int, cap: str) -> dict:
    import dataclasses

    from app.lifecycle.message import chunks
    from app.worker import collector
    from app.worker.context import WorkerContext
    from tests.rows import insert_jobs, job_row, webhook_target

    engine = stack.registry.engines[0]
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE runs")
        conn.exec_driver_sql("DELETE FROM jobs")
    first = len(sink.arrivals())
    due = datetime.now(UTC) - timedelta(seconds=1)
    insert_jobs(
        stack.registry,
        [
            job_row(
                stack.shards, owner=stack.owner, run_at=due, target=webhook_target(sink.url(f"/hook/{i}"))
            )
            for i in range(runs)
        ],
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
    claimed = _claim_all(stack)
    messages = list(chunks(claimed, MESSAGE_RUNS))
    settings = dataclasses.replace(stack.settings, target_max_concurrency=int(cap))
    context = WorkerContext(settings)
    context.dispatcher  # noqa: B018 - made (and its modules imported) before the collector is set
    collector.tune()  # as a pool process of `celery -A app worker` does once it has started
    meter = CpuMeter(
        {}, services=("redis-server",), dynamic={"postgres (backends)": backend_pids(stack.dsns[0])}
    )
    try:
        meter.start()
        cpu_before, began = time.process_time(), time.perf_counter()
        for message in messages:
            context.dispatcher.dispatch(message)
        while context.dispatcher.in_flight():
            time.sleep(0.002)
        elapsed = time.perf_counter() - began
        cpu = {"worker (this process)": time.process_time() - cpu_before, **meter.stop()}
    finally:
        context.close(30)
    time.sleep(0.5)  # the sink's log is flushed every 250 ms
    paths = [arrival.path for arrival in sink.arrivals()[first:]]
    states = _recorded(stack)
    return {
        "target_max_concurrency": int(cap),
        "runs": len(claimed),
        "calls_received": len(paths),
        "jobs_called_twice": len(paths) - len(set(paths)),
        "run_states": states,
        "elapsed_s": round(elapsed, 3),
        "runs_per_s": round(len(claimed) / elapsed, 1),
        "cpu_ms_per_run": {name: round(1000 * seconds / len(claimed), 4) for name, seconds in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10000, help="runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each cap, alternated")
    parser.add_argument(
        "--default-cap",
        default=None,
        help="PUNCTUAL_TARGET_MAX_CONCURRENCY values to alternate, comma-separated (default: shipped)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="PUNCTUAL_X=Y")
    parser.add_argument("--label", default="", help="a word for the result file's name")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    load_before = os.getloadavg()
    with fresh_redis_prefix() as prefix:
        env = {"PUNCTUAL_REDIS_URL": REDIS_URL, "PUNCTUAL_REDIS_PREFIX": prefix, **overrides}
        with Stack(physical=1, env=env) as stack, NginxSink() as sink:
            caps = (args.default_cap or str(stack.settings.target_max_concurrency)).split(",")
            rows = []
            for _ in range(args.rounds):
                for cap in caps:  # alternated: drift in the box's load hits every setting
                    row = measure(stack, sink, args.runs, cap)
                    rows.append(row)
                    print(
                        f"cap {cap:>4}: {row['runs_per_s']:8.1f} runs/s  cpu-ms/run "
                        + ", ".join(f"{k} {v}" for k, v in row["cpu_ms_per_run"].items())
                        + f"  (called {row['calls_received']}, twice {row['jobs_called_twice']})"
                    )
            settings = effective_settings({**stack.env, "PUNCTUAL_REDIS_URL": REDIS_URL})
    medians = {
        cap: {
            "runs_per_s": median(r["runs_per_s"] for r in rows if str(r["target_max_concurrency"]) == cap),
            "worker_cpu_ms_per_run": median(
                r["cpu_ms_per_run"]["worker (this process)"]
                for r in rows
                if str(r["target_max_concurrency"]) == cap
            ),
        }
        for cap in caps
    }
    for cap, figures in medians.items():
        print(
            f"median cap {cap:>4}: {figures['runs_per_s']:8.1f} runs/s, "
            f"worker {figures['worker_cpu_ms_per_run']} cpu-ms/run"
        )
    path = write_result(
        "dispatch",
        {
            "runs": args.runs,
            "message_runs": MESSAGE_RUNS,
            "medians": medians,
            "measurements": rows,
            "settings": settings,
            "machine": machine(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        args.label,
    )
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
