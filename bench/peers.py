"""The peers: the same burst (N jobs due at one instant T, job i calling /hook/<i>
on the same nginx sink), run by the schedulers a user might pick instead.

    python -m bench.peers pgqueuer --jobs 20000
    python -m bench.peers celery --jobs 20000

- pgqueuer: PgQueuer (asyncpg) on a fresh Postgres database. The jobs are enqueued
  in batches of 1,000 with execute_after = T - now; --processes consumer processes
  (default: one per core, as its users run it) each run
  QueueManager.run(max_concurrent_tasks=64, batch_size=32), their entrypoint
  POSTing with one aiohttp session (64 connections) each. --analyze runs ANALYZE on its
  table once the jobs are in, as `bench.burst --analyze` does on Punctual's registry.
- celery: plain Celery on a fresh RabbitMQ vhost: `hook.apply_async(eta=T)` per
  job from the bench, one `celery -A bench.celery_peer worker -P threads -c 64`
  calling with requests (bench/celery_peer.py).

The figures are bench.burst's (bench/harness.py), from the same sink and /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.burst import add_common_arguments
from bench.cpu import CpuMeter
from bench.harness import (
    OWN_BACKENDS,
    WINDOW_LEAD_S,
    due_instant,
    header,
    measure_burst,
    plot,
    stop_cleanly_on_sigterm,
    summary,
    write_result,
)
from bench.nginx import NginxSink
from bench.stack import REPO, Process, analyze, backend_pids, base_env, fresh_database, fresh_vhost

# Jobs/s each peer registers at on 2 cores (a third under what was seen), to place T
# far enough ahead that registration ends before the CPU window opens.
PGQUEUER_ENQUEUE_GUESS = 3000
CELERY_ENQUEUE_GUESS = 300


def say_due(jobs: int, due: float) -> None:
    at = datetime.fromtimestamp(due, UTC).strftime("%H:%M:%S")
    print(f"registering {jobs:,} jobs due at {at} (in {due - time.time():.0f} s)", flush=True)


def _peer_env(**extra: str) -> dict[str, str]:
    return {**base_env(), "PYTHONPATH": str(REPO), **extra}


# -- PgQueuer ---------------------------------------------------------------------------------


async def _pgqueuer_install(dsn: str) -> None:
    import asyncpg
    from pgqueuer import Queries

    conn = await asyncpg.connect(dsn)
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


async def _pgqueuer_enqueue(dsn: str, jobs: int, due: float, batch: int = 1000) -> None:
    import asyncpg
    from pgqueuer import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        for start in range(0, jobs, batch):
            ids = range(start, min(jobs, start + batch))
            # execute_after is relative to the database's now(): computed per batch.
            after = timedelta(seconds=due - time.time())
            await queries.enqueue(
                ["hook"] * len(ids), [str(i).encode() for i in ids], [0] * len(ids), [after] * len(ids)
            )
    finally:
        await conn.close()


def _pgqueuer_register(dsn: str, jobs: int, due: float, then_analyze: bool) -> None:
    asyncio.run(_pgqueuer_enqueue(dsn, jobs, due))
    if then_analyze:  # as `bench.burst --analyze` does for Punctual's registry
        analyze(dsn, ("pgqueuer",))


async def _pgqueuer_worker(dsn: str, sink: str, concurrency: int, batch_size: int) -> None:
    import aiohttp
    import asyncpg
    from pgqueuer import Job, Queries, QueueManager

    conn = await asyncpg.connect(dsn)
    manager = QueueManager(Queries.from_asyncpg_connection(conn))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        @manager.entrypoint("hook")
        async def hook(job: Job) -> None:
            i = job.payload.decode()
            async with session.post(
                f"{sink}/hook/{i}",
                data=f'{{"n":{i}}}'.encode(),
                headers={"Content-Type": "application/json", "Idempotency-Key": f"pgq-{i}"},
            ) as r:
                await r.read()
                r.raise_for_status()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
        print("pgqueuer worker ready", flush=True)
        await manager.run(batch_size=batch_size, max_concurrent_tasks=concurrency)
    await conn.close()


def run_pgqueuer(args: argparse.Namespace) -> dict:
    result = header("peers")
    log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-pgq-"))
    with NginxSink(install=args.install_sink) as sink, fresh_database("bench_pgq") as dsn:
        asyncio.run(_pgqueuer_install(dsn))
        workers = [
            Process(
                f"pgqueuer-worker-{n}",
                [
                    sys.executable,
                    "-m",
                    "bench.peers",
                    "pgqueuer-worker",
                    "--dsn",
                    dsn,
                    "--sink",
                    sink.url(""),
                    "--concurrency",
                    str(args.concurrency),
                    "--batch-size",
                    str(args.batch_size),
                ],
                _peer_env(),
                log_dir,
            )
            for n in range(args.processes)
        ]
        try:
            for worker in workers:
                worker.wait_for("pgqueuer worker ready")
            due = due_instant(args.lead_s or args.jobs / PGQUEUER_ENQUEUE_GUESS + WINDOW_LEAD_S + 10)
            say_due(args.jobs, due)
            registration, figures = _register_and_measure(
                args,
                sink,
                due,
                "Queries.enqueue, batches of 1,000",
                lambda: _pgqueuer_register(dsn, args.jobs, due, args.analyze),
                lambda: CpuMeter(
                    {"pgqueuer workers": [w.pid for w in workers], "nginx (sink)": [sink.pid]},
                    services=("postgres",),
                    dynamic={OWN_BACKENDS: backend_pids(dsn)},
                ),
            )
        finally:
            for worker in workers:
                worker.stop()
    from importlib.metadata import version

    result.update(
        system="pgqueuer",
        registration=registration,
        analyzed_before_t=bool(args.analyze),
        **figures,
        peer={
            "pgqueuer": version("pgqueuer"),
            "asyncpg": version("asyncpg"),
            "aiohttp": version("aiohttp"),
            "max_concurrent_tasks": args.concurrency,
            "batch_size": args.batch_size,
            "processes": args.processes,
            "worker": " ".join(workers[0].argv[1:]),
        },
    )
    return result


def _register_and_measure(
    args: argparse.Namespace,
    sink,
    due: float,
    way: str,
    enqueue: Callable[[], None],
    meter: Callable[[], CpuMeter],
) -> tuple[dict, dict]:
    """Time `enqueue` (the whole burst, due at `due`), then measure the burst at the sink."""
    began = time.perf_counter()
    enqueue()
    elapsed = time.perf_counter() - began
    registration = {
        "way": way,
        "jobs": args.jobs,
        "failures": 0,
        "elapsed_s": round(elapsed, 2),
        "jobs_per_s": round(args.jobs / elapsed, 1),
    }
    figures = measure_burst(
        sink,
        args.jobs,
        due,
        meter(),
        timeout_s=args.timeout_s,
        stall_s=args.stall_s,
        settle_s=args.settle_s,
        registered_at=time.time(),
    )
    return registration, figures


# -- Celery -----------------------------------------------------------------------------------


def run_celery(args: argparse.Namespace) -> dict:
    result = header("peers")
    log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-celery-"))
    with NginxSink(install=args.install_sink) as sink, fresh_vhost("bench_celery") as broker:
        env = _peer_env(BENCH_PEER_BROKER=broker, BENCH_PEER_SINK=sink.url(""))
        argv = [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "bench.celery_peer",
            "worker",
            "-P",
            "threads",
            "-c",
            str(args.concurrency),
            "--loglevel",
            "INFO",
        ]
        worker = Process("celery-worker", argv, env, log_dir)
        try:
            worker.wait_for(" ready.")
            os.environ["BENCH_PEER_BROKER"] = broker  # the app below reads it on import
            from bench.celery_peer import app, hook

            app.conf.broker_url = broker
            due = due_instant(args.lead_s or args.jobs / CELERY_ENQUEUE_GUESS + WINDOW_LEAD_S + 10)
            eta = datetime.fromtimestamp(due, UTC)
            say_due(args.jobs, due)

            def enqueue() -> None:
                with app.producer_or_acquire() as producer:
                    for i in range(args.jobs):
                        hook.apply_async((i,), eta=eta, producer=producer)

            registration, figures = _register_and_measure(
                args,
                sink,
                due,
                "apply_async(eta=T), one producer",
                enqueue,
                lambda: CpuMeter(
                    {"celery worker": [worker.pid], "nginx (sink)": [sink.pid]}, services=("beam.smp",)
                ),
            )
        finally:
            worker.stop()
    from importlib.metadata import version

    result.update(
        system="celery",
        registration=registration,
        **figures,
        peer={
            "celery": version("celery"),
            "kombu": version("kombu"),
            "requests": version("requests"),
            "pool": "threads",
            "concurrency": args.concurrency,
            "worker": " ".join(argv[1:]),
        },
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="peer", required=True)
    pgq = commands.add_parser(
        "pgqueuer", help="PgQueuer: execute_after=T, one consumer process per core, 64 async jobs each"
    )
    add_common_arguments(pgq)
    pgq.add_argument("--concurrency", type=int, default=64, help="max_concurrent_tasks of the worker")
    pgq.add_argument(
        "--batch-size", type=int, default=32, help="dequeue batch (at most half the concurrency)"
    )
    pgq.add_argument(
        "--processes",
        type=int,
        default=os.cpu_count() or 1,
        help="consumer processes (default: one per core, as PgQueuer's users run it)",
    )
    pgq.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the queue's table once the jobs are in, before T, as autovacuum would "
        "(this box has it off; bench.burst --analyze does the same for Punctual)",
    )
    cel = commands.add_parser("celery", help="Celery: apply_async(eta=T), threads pool, RabbitMQ, requests")
    add_common_arguments(cel)
    cel.add_argument("--concurrency", type=int, default=64, help="threads of the worker's pool")
    inner = commands.add_parser("pgqueuer-worker", help="(internal) the PgQueuer worker process")
    inner.add_argument("--dsn", required=True)
    inner.add_argument("--sink", required=True)
    inner.add_argument("--concurrency", type=int, default=64)
    inner.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.peer == "pgqueuer-worker":
        asyncio.run(_pgqueuer_worker(args.dsn, args.sink, args.concurrency, args.batch_size))
        return
    stop_cleanly_on_sigterm()
    result = (run_pgqueuer if args.peer == "pgqueuer" else run_celery)(args)
    path = write_result(
        result, f"peers-{args.peer}", f"{args.jobs}{'-' + args.label if args.label else ''}", args.out
    )
    print(summary(result))
    print(f"written to {path}")
    if args.plot:
        print(f"plot: {plot(path, result)}")


if __name__ == "__main__":
    main()
