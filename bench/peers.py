"""The peers: the same burst (N jobs due at one instant T, job i calling /hook/<i>
on the same nginx sink), run by the schedulers a user might pick instead.

    python -m bench.peers pgqueuer --jobs 20000
    python -m bench.peers pgqueuer --steady 200 [--duration-s 120]
    python -m bench.peers celery --jobs 20000

- pgqueuer: PgQueuer (asyncpg) on a fresh Postgres database. The jobs are enqueued
  in batches of 1,000 with execute_after = T - now; --processes consumer processes
  (default: one per core, as its users run it) each run
  QueueManager.run(max_concurrent_tasks=64, batch_size=32), their entrypoint
  POSTing with one aiohttp session (64 connections) each. --analyze runs ANALYZE on its
  table once the jobs are in, as `bench.burst --analyze` does on Punctual's registry.
  --steady R: instead of the burst, R jobs a second due for --duration-s (bench.steady's
  one-offs), each with its own execute_after.
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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.burst import add_common_arguments
from bench.cpu import CpuMeter, per_run_ms, with_own_total
from bench.figures import Arrival, lateness_figures
from bench.harness import (
    OWN_BACKENDS,
    WINDOW_LEAD_S,
    due_instant,
    header,
    measure_burst,
    plot,
    sleep_until,
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


async def _pgqueuer_enqueue(dsn: str, dues: Sequence[float], batch: int = 1000) -> None:
    """Job i, calling /hook/<i>, due at dues[i] (Unix time)."""
    import asyncpg
    from pgqueuer import Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        for start in range(0, len(dues), batch):
            ids = range(start, min(len(dues), start + batch))
            # execute_after is relative to the database's now(): computed per batch.
            now = time.time()
            await queries.enqueue(
                ["hook"] * len(ids),
                [str(i).encode() for i in ids],
                [0] * len(ids),
                [timedelta(seconds=dues[i] - now) for i in ids],
            )
    finally:
        await conn.close()


def _pgqueuer_register(dsn: str, jobs: int, due: float, then_analyze: bool) -> None:
    asyncio.run(_pgqueuer_enqueue(dsn, [due] * jobs))
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


def _pgqueuer_workers(args: argparse.Namespace, dsn: str, sink: NginxSink) -> list[Process]:
    """--processes consumer processes, started and ready."""
    log_dir = Path(tempfile.mkdtemp(prefix="punctual-bench-pgq-"))
    argv = [sys.executable, "-m", "bench.peers", "pgqueuer-worker", "--dsn", dsn, "--sink", sink.url("")]
    argv += ["--concurrency", str(args.concurrency), "--batch-size", str(args.batch_size)]
    workers = [Process(f"pgqueuer-worker-{n}", argv, _peer_env(), log_dir) for n in range(args.processes)]
    for worker in workers:
        worker.wait_for("pgqueuer worker ready")
    return workers


def _pgqueuer_meter(workers: list[Process], sink: NginxSink, dsn: str) -> CpuMeter:
    return CpuMeter(
        {"pgqueuer workers": [w.pid for w in workers], "nginx (sink)": [sink.pid]},
        services=("postgres",),
        dynamic={OWN_BACKENDS: backend_pids(dsn)},
    )


def run_pgqueuer(args: argparse.Namespace) -> dict:
    result = header("peers")
    with NginxSink(install=args.install_sink) as sink, fresh_database("bench_pgq") as dsn:
        asyncio.run(_pgqueuer_install(dsn))
        workers: list[Process] = []
        try:
            workers = _pgqueuer_workers(args, dsn, sink)
            if args.steady:
                figures = _pgqueuer_steady(args, dsn, sink, workers)
                registration = figures.pop("registration")
            else:
                due = due_instant(args.lead_s or args.jobs / PGQUEUER_ENQUEUE_GUESS + WINDOW_LEAD_S + 10)
                say_due(args.jobs, due)
                registration, figures = _register_and_measure(
                    args,
                    sink,
                    due,
                    "Queries.enqueue, batches of 1,000",
                    lambda: _pgqueuer_register(dsn, args.jobs, due, args.analyze),
                    lambda: _pgqueuer_meter(workers, sink, dsn),
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


def _pgqueuer_steady(args: argparse.Namespace, dsn: str, sink: NginxSink, workers: list[Process]) -> dict:
    """`--steady R`: R one-off jobs a second due for --duration-s, spread evenly (job i
    due at the window's start + i/R), as bench.steady's one-offs; start lateness at the
    sink and CPU per run from the window's start until every job has called (or none
    has for --stall-s)."""
    jobs = round(args.steady * args.duration_s)
    start = due_instant(args.lead_s or jobs / PGQUEUER_ENQUEUE_GUESS + WINDOW_LEAD_S + 10)
    dues = [start + i / args.steady for i in range(jobs)]
    say_due(jobs, start)
    began = time.perf_counter()
    asyncio.run(_pgqueuer_enqueue(dsn, dues))
    elapsed = time.perf_counter() - began
    if args.analyze:
        analyze(dsn, ("pgqueuer",))
    meter = _pgqueuer_meter(workers, sink, dsn)
    sleep_until(start)
    meter.start()
    sleep_until(start + args.duration_s)
    last, changed = -1, time.time()
    while (called := len({a.path for a in sink.arrivals()})) < jobs and time.time() - changed < args.stall_s:
        if called != last:
            last, changed = called, time.time()
        time.sleep(1)
    cpu_s = meter.stop()
    time.sleep(args.settle_s)  # late duplicates, and the log's last flush
    figures = steady_figures(sink.arrivals(), dues)
    return {
        "registration": {
            "way": "Queries.enqueue, batches of 1,000",
            "jobs": jobs,
            "elapsed_s": round(elapsed, 2),
        },
        "steady": {"rate": args.steady, "duration_s": args.duration_s},
        **figures,
        "cpu_s": cpu_s,
        "cpu_ms_per_run": with_own_total(per_run_ms(cpu_s, figures["started"], not_in_total=(OWN_BACKENDS,))),
    }


def steady_figures(arrivals: Sequence[Arrival], dues: Sequence[float]) -> dict:
    """Job i (path /hook/<i>) due at dues[i]: how many called, missing and called again,
    and the lateness of each job's first call (a call before its instant counts as 0)."""
    first: dict[int, float] = {}
    calls = 0
    for arrival in arrivals:
        job = int(arrival.path.rsplit("/", 1)[1])
        if 0 <= job < len(dues):
            calls += 1
            first[job] = min(first.get(job, arrival.at), arrival.at)
    return {
        "started": len(first),
        "missing": len(dues) - len(first),
        "duplicate_calls": calls - len(first),
        "lateness_s": lateness_figures([max(0.0, at - dues[job]) for job, at in first.items()]),
    }


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


def _steady_summary(result: dict) -> str:
    late = result["lateness_s"]
    cpu = ", ".join(f"{name} {ms}" for name, ms in result["cpu_ms_per_run"].items())
    return (
        f"steady {result['steady']['rate']:g}/s for {result['steady']['duration_s']:g} s: "
        f"{result['started']:,} started, {result['missing']} missing, "
        f"{result['duplicate_calls']} duplicate calls\n"
        f"start lateness p50 {late['p50']} s  p90 {late['p90']} s  p99 {late['p99']} s  max {late['max']} s\n"
        f"CPU-ms per run: {cpu}"
    )


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
        "--steady",
        type=float,
        default=0,
        metavar="RATE",
        help="instead of the burst: RATE one-off jobs a second due for --duration-s, spread evenly",
    )
    pgq.add_argument("--duration-s", type=float, default=120, help="the --steady window")
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
    size = f"steady-{args.steady:g}" if getattr(args, "steady", 0) else str(args.jobs)
    path = write_result(
        result, f"peers-{args.peer}", f"{size}{'-' + args.label if args.label else ''}", args.out
    )
    print(_steady_summary(result) if "steady" in result else summary(result))
    print(f"written to {path}")
    if args.plot:
        print(f"plot: {plot(path, result)}")


if __name__ == "__main__":
    main()
