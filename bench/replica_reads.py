"""Replica reads: GET /jobs and GET /jobs/{id}/runs during a burst, with and without a replica.

    python -m bench.replica_reads --jobs 5000 [--replica] [--set PUNCTUAL_X=Y ...]

The burst of bench.burst (one-off webhook jobs due at one instant T, Punctual
started as the README says, shipped defaults) while one reader asks, back to back
from T until the burst has arrived, for the first page of GET /jobs (limit 100) and
the runs of a job of the burst (GET /jobs/{id}/runs), alternately. With --replica a
streaming replica of the server (scripts/pg-replica, on a free port, removed after)
is PUNCTUAL_REPLICA_URLS, so those reads go to it. Figures: each route's p50/p99
and count, the burst's own figures (lateness, CPU per run: the primary's own
backends apart, as "postgres (this database's backends)").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from bench.burst import REGISTRATION_RATE_GUESS, add_common_arguments, job_body
from bench.harness import (
    WINDOW_LEAD_S,
    due_instant,
    header,
    measure_burst,
    stop_cleanly_on_sigterm,
    write_result,
)
from bench.nginx import NginxSink
from bench.register import register
from bench.stack import PunctualStack, free_port, parse_overrides

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pg-replica"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Reader(threading.Thread):
    """GET /jobs and GET /jobs/{id}/runs alternately, back to back, until stopped."""

    def __init__(self, url: str, api_key: str, job_ids: list[str]):
        super().__init__(daemon=True)
        self.url, self.headers, self.job_ids = url, {"Authorization": f"Bearer {api_key}"}, job_ids
        self.stop = threading.Event()
        self.times: dict[str, list[float]] = {"GET /jobs": [], "GET /jobs/{id}/runs": []}
        self.errors = 0

    def _get(self, path: str) -> None:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            route = "GET /jobs" if n % 2 == 0 else "GET /jobs/{id}/runs"
            path = "/jobs?limit=100" if n % 2 == 0 else f"/jobs/{self.job_ids[n % len(self.job_ids)]}/runs"
            began = time.perf_counter()
            try:
                self._get(path)
                self.times[route].append(time.perf_counter() - began)
            except OSError:
                self.errors += 1
            n += 1

    def figures(self) -> dict:
        return {
            route: {
                "count": len(values),
                "p50_ms": round(1000 * (percentile(values, 0.5) or 0), 1),
                "p99_ms": round(1000 * (percentile(values, 0.99) or 0), 1),
            }
            for route, values in self.times.items()
        } | {"errors": self.errors}


def first_page_ids(url: str, api_key: str) -> list[str]:
    request = urllib.request.Request(url + "/jobs?limit=100", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return [job["id"] for job in json.loads(response.read())["items"]]


def run(args: argparse.Namespace) -> dict:
    result = header("replica_reads")
    overrides = parse_overrides(args.set)
    replica_port = free_port() if args.replica else None
    if replica_port is not None:
        subprocess.run([str(SCRIPT), "up", str(replica_port)], check=True)
    try:
        with (
            NginxSink(install=args.install_sink) as sink,
            PunctualStack(overrides, replica_port=replica_port) as stack,
        ):
            claim_ahead_s = float(stack.settings["PUNCTUAL_CLAIM_AHEAD_S"])
            window_lead_s = max(WINDOW_LEAD_S, claim_ahead_s + 5)
            lead_s = args.lead_s or args.jobs / REGISTRATION_RATE_GUESS + window_lead_s + 10
            due = due_instant(lead_s)
            due_at = datetime.fromtimestamp(due, UTC)
            registration = register(
                stack.url, stack.api_key, [job_body(sink, due_at, i) for i in range(args.jobs)], clients=16
            )
            reader = Reader(stack.url, stack.api_key, first_page_ids(stack.url, stack.api_key))
            meter = stack.cpu_meter(sink.pid)
            threading.Timer(max(0.0, due - time.time()), reader.start).start()
            figures = measure_burst(
                sink,
                args.jobs,
                due,
                meter,
                window_lead_s=window_lead_s,
                timeout_s=args.timeout_s,
                stall_s=args.stall_s,
                settle_s=0,
                registered_at=datetime.now().timestamp(),
            )
            reader.stop.set()
            reader.join(60)
            with urllib.request.urlopen(stack.url + "/metrics", timeout=30) as response:
                skipped = [
                    line
                    for line in response.read().decode().splitlines()
                    if line.startswith("punctual_replica_skipped_reads_total")
                ]
            result.update(
                system="punctual",
                replica=bool(args.replica),
                reads=reader.figures(),
                replica_skipped_reads=skipped,
                registration=registration,
                **figures,
                settings=stack.settings,
                set_by_flag=overrides,
                processes=stack.commands,
            )
    finally:
        if replica_port is not None:
            subprocess.run([str(SCRIPT), "down", str(replica_port)], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replica_reads", description=__doc__.split("\n\n")[0]
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--replica", action="store_true", help="serve the replica reads from a streaming replica"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=Y",
        help="set one Punctual setting (repeatable)",
    )
    stop_cleanly_on_sigterm()
    args = parser.parse_args()
    result = run(args)
    label = f"{args.jobs}-{'replica' if args.replica else 'primary'}{'-' + args.label if args.label else ''}"
    path = write_result(result, "replica_reads", label, args.out)
    reads = result["reads"]
    print(
        f"{'replica' if args.replica else 'primary'}: "
        + ", ".join(
            f"{route} p50 {v['p50_ms']} ms p99 {v['p99_ms']} ms ({v['count']})"
            for route, v in reads.items()
            if route != "errors"
        )
        + f"; lateness p99 {result['lateness_s'].get('p99')} s; cpu/run {result['cpu_ms_per_run']}"
        + f"; skipped {result['replica_skipped_reads']}"
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
