"""Job creation through the HTTP API: `python -m bench.create --clients 16 --jobs 20000`.

Without --url it builds what it measures: two fresh Postgres databases (two
physical shards, 16 logical ones) on PUNCTUAL_BENCH_PG (default the local server),
an owner and key, and `punctual api` (gunicorn) on a free port; afterwards it stops
the server (SIGTERM) and drops the databases. With --url and --api-key it measures
a running API instead.

Clients: --clients keep-alive HTTP connections, spread over --client-procs processes
so the load generator's own GIL is not what is measured. Each request is a real
create with its own Idempotency-Key; with --batch N each request is one
`POST /jobs/batch` of N jobs, each with its own `idempotency_key` (a job counts as
created when its item answers 201). Prints jobs/s and latency percentiles (per
request), and writes the result as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from urllib.parse import urlsplit

from bench.common import RESULTS, Connection, Stack


def job_body(i: int) -> bytes:
    return json.dumps(
        {
            "name": f"bench-{i}",
            "target": {"type": "webhook", "url": "http://127.0.0.1:9/hook", "headers": {"X-Bench": "1"}},
            "payload": {"n": i, "note": "created by bench.create"},
            "schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Berlin"},
            "jitter_s": 30,
        }
    ).encode()


def batch_body(run: str, size: int, jobs: int, i: int, body: Callable[[int], bytes] = job_body) -> bytes:
    """Request i of a batched run: jobs i*size .. (i+1)*size - 1 (fewer in the last)."""
    items = []
    for n in range(i * size, min(jobs, (i + 1) * size)):
        item = json.loads(body(n))
        item["idempotency_key"] = f"bench-{run}-{n}"
        items.append(item)
    return json.dumps({"jobs": items}).encode()


def _client_thread(
    url: str,
    api_key: str,
    jobs: list[int],
    latencies: list[float],
    failures: list[str],
    start: threading.Event,
    body: Callable[[int], bytes],
    batched: bool,
) -> None:
    parts = urlsplit(url)
    conn = Connection(parts.hostname, parts.port or 80)
    run = uuid.uuid4().hex[:8]
    payloads = {i: body(i) for i in jobs}  # built before the clock starts: the client's own work
    start.wait()
    for i in jobs:
        headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        if not batched:
            headers["Idempotency-Key"] = f"bench-{run}-{i}"
        payload = payloads.pop(i)
        jobs_sent = payload.count(b'"idempotency_key"') if batched else 1  # one key per job of a batch
        began = time.perf_counter()
        try:
            status = conn.post("/jobs/batch" if batched else "/jobs", headers, payload)
            if status != (200 if batched else 201):
                failures.extend([f"HTTP {status}"] * jobs_sent)
            elif batched:
                items = json.loads(conn.body)["items"]
                failures.extend(f"item {item['status']}" for item in items if item["status"] != 201)
        except (OSError, ValueError, StopIteration) as exc:
            failures.extend([type(exc).__name__] * jobs_sent)
            conn.close()
        latencies.append(time.perf_counter() - began)
    conn.close()


def _client_process(args: tuple) -> tuple[list[float], list[str], float, float]:
    url, api_key, job_ids, threads, start_at, body, batched = args
    latencies: list[float] = []
    failures: list[str] = []
    start = threading.Event()
    chunks = [job_ids[i::threads] for i in range(threads)]
    workers = [
        threading.Thread(
            target=_client_thread, args=(url, api_key, chunk, latencies, failures, start, body, batched)
        )
        for chunk in chunks
    ]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, start_at - time.time()))  # every process starts at the same wall-clock instant
    began = time.time()
    start.set()
    for worker in workers:
        worker.join()
    return latencies, failures, began, time.time()


def measure(
    url: str,
    api_key: str,
    clients: int,
    jobs: int,
    client_procs: int,
    body: Callable[[int], bytes] = job_body,
    batch: int = 0,
) -> dict:
    """Create `jobs` jobs (request i sends body(i); a picklable callable) with `clients`
    keep-alive connections over `client_procs` processes; `batch` > 0: that many jobs
    per `POST /jobs/batch` request."""
    procs = max(1, min(client_procs, clients))
    per_proc = [clients // procs + (1 if p < clients % procs else 0) for p in range(procs)]
    if batch:
        ids = list(range((jobs + batch - 1) // batch))
        body = partial(batch_body, uuid.uuid4().hex[:8], batch, jobs, body=body)
    else:
        ids = list(range(jobs))
    start_at = time.time() + 1.0
    work = [(url, api_key, ids[p::procs], per_proc[p], start_at, body, bool(batch)) for p in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        results = pool.map(_client_process, work)
    latencies = sorted(latency for r in results for latency in r[0])
    failures = [f for r in results for f in r[1]]
    elapsed = max(r[3] for r in results) - min(r[2] for r in results)

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {
        "jobs": jobs,
        "batch": batch,
        "clients": clients,
        "client_procs": procs,
        "elapsed_s": round(elapsed, 3),
        "jobs_per_s": round((jobs - len(failures)) / elapsed, 1),
        "failures": len(failures),
        "failure_kinds": sorted(set(failures))[:10],
        "latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99), "max": pct(1.0)},
    }


class LocalStack:
    """Two fresh databases (two physical shards, 16 logical ones) + `punctual api`."""

    def __init__(self, workers: int | None, threads: int | None):
        self.stack = Stack(physical=2)
        self.workers, self.threads = workers, threads

    def __enter__(self) -> LocalStack:
        self.stack.__enter__()
        self.url = self.stack.start_api(self.workers, self.threads)
        self.api_key = self.stack.api_key
        return self

    def count_jobs(self) -> int:
        return self.stack.count_jobs()

    def __exit__(self, *exc) -> None:
        self.stack.__exit__(*exc)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.create", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", type=int, default=16, help="concurrent HTTP clients (keep-alive connections)"
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to create")
    parser.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over")
    parser.add_argument(
        "--warmup", type=int, default=500, help="creates before the measurement (not counted)"
    )
    parser.add_argument("--url", help="measure a running API instead of starting one")
    parser.add_argument("--api-key", default=os.environ.get("PUNCTUAL_API_KEY"), help="with --url")
    parser.add_argument("--workers", type=int, help="gunicorn workers of the API started here")
    parser.add_argument("--threads", type=int, help="threads per gunicorn worker")
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        metavar="N",
        help="N jobs per POST /jobs/batch request (1-1000; default: one POST /jobs per job)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.batch <= 1000:
        parser.error("--batch must be 1 to 1000 (or 0: no batches)")

    def run(url: str, api_key: str) -> dict:
        if args.warmup:
            measure(url, api_key, args.clients, args.warmup, args.client_procs, batch=args.batch)
        before = os.getloadavg()[0]
        result = measure(url, api_key, args.clients, args.jobs, args.client_procs, batch=args.batch)
        # Whatever else the box runs competes for the same cores: keep it beside the figure.
        result["load_average_1m"] = {"before": round(before, 2), "after": round(os.getloadavg()[0], 2)}
        return result

    if args.url:
        if not args.api_key:
            raise SystemExit("bench: --url needs --api-key (or PUNCTUAL_API_KEY)")
        result = run(args.url, args.api_key)
        result["server"] = {"url": args.url}
    else:
        with LocalStack(args.workers, args.threads) as stack:
            result = run(stack.url, stack.api_key)
            from app.cli.serve import DEFAULT_THREADS, default_workers

            result["server"] = {
                "workers": args.workers or default_workers(),
                "threads": args.threads or DEFAULT_THREADS,
                "stored_jobs": stack.count_jobs(),
            }
    result.update(
        bench="create",
        cpus=os.cpu_count(),
        at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command="python -m bench.create " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"create-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    per_request = f"batches of {args.batch}, " if args.batch else ""
    print(
        f"{result['jobs_per_s']:.0f} jobs/s  ({result['jobs']} jobs, {per_request}"
        f"{result['clients']} clients, "
        f"{result['elapsed_s']}s, p50 {result['latency_ms']['p50']} ms, "
        f"p99 {result['latency_ms']['p99']} ms, {result['failures']} failures, "
        f"load {result['load_average_1m']['before']}->{result['load_average_1m']['after']})"
        f"  -> {path}"
    )
    return result


if __name__ == "__main__":
    main()
