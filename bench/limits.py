"""Limits under a burst: what a concurrency cap or a rate does to N runs due at once.

    python -m bench.limits --jobs 80 --delay-ms 50 --cap 4
    python -m bench.limits --jobs 20000 --delay-ms 1                  # the default cap (200)
    python -m bench.limits --jobs 20000 --delay-ms 1 --default-cap 0  # no cap at all
    python -m bench.limits --jobs 20000 --delay-ms 200 --cap 200
    python -m bench.limits --jobs 10000 --rate 100
    python -m bench.limits --jobs 20000 --delay-ms 1 --set PUNCTUAL_DISPATCH_THREADS=64

Builds the real stack (bench.common.Stack: fresh databases, vhost and Redis prefix;
one `celery -A app worker` and `celery -A app beat` started by tests/e2e/processes.py)
with the shipped defaults except what a flag sets (--set PUNCTUAL_X=Y: any setting),
and a sink in its own process that answers each call after --delay-ms and records
arrivals and the most calls it held at once. The N one-off jobs are written straight
into the registry, due at one instant T; with --cap or --rate every job carries
`limits` {key, max_concurrency / rate_per_s}.
Reports: T to the last start, starts/s, the peak of calls in flight seen by the sink,
starts per second (for a rate: the rate delivered over the first minute), runs held
back to the registry (punctual_runs_total{outcome="held"}, scraped from the worker's
metrics port), leases expired, CPU seconds per component (bench.cpu). JSON goes to
bench/results/ with every PUNCTUAL_* value in effect.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta

from bench.common import Stack, free_port, machine, write_result
from bench.cpu import SERVICES, CpuMeter, per_run_ms
from bench.figures import lateness_figures, per_second
from bench.stack import effective_settings, parse_overrides

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class _Delayed(asyncio.Protocol):
    def __init__(self, delay_s: float, state: dict):
        self.delay_s, self.state, self.buffer = delay_s, state, b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            line_end = head.find(b"\r\n", at)
            length = int(head[at + 15 : line_end if line_end >= 0 else None]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                break
            self.buffer = self.buffer[end + 4 + length :]
            state = self.state
            state["arrivals"].append(time.time())
            state["open"] += 1
            state["peak"] = max(state["peak"], state["open"])
            if self.delay_s > 0:
                asyncio.get_running_loop().call_later(self.delay_s, self._answer)
            else:
                self._answer()

    def _answer(self) -> None:
        self.state["open"] -= 1
        if not self.transport.is_closing():
            self.transport.write(_ANSWER)


def _serve(delay_s: float, port_value, ready, control) -> None:
    state = {"arrivals": [], "open": 0, "peak": 0}

    def answer_control() -> None:
        control.recv()
        control.send((state["arrivals"], state["peak"]))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Delayed(delay_s, state), "127.0.0.1", 0, backlog=4096)
        loop.add_reader(control.fileno(), answer_control)
        port_value.value = server.sockets[0].getsockname()[1]
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


class DelaySink:
    """Answers 200 after `delay_s`; records arrival times and the peak of open calls."""

    def __init__(self, delay_s: float):
        ctx = multiprocessing.get_context("fork")
        self._port = ctx.Value("i", 0)
        ready = ctx.Event()
        self._control, child_end = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(delay_s, self._port, ready, child_end), daemon=True)
        self._process.start()
        if not ready.wait(10):
            raise RuntimeError("the bench sink did not start")

    @property
    def pid(self) -> int:
        return self._process.pid

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._port.value}{path}"

    def seen(self) -> tuple[list[float], int]:
        self._control.send("dump")
        return self._control.recv()

    def close(self) -> None:
        self._process.kill()
        self._process.join(5)


def _count_runs(stack: Stack) -> list:
    import sqlalchemy as sa

    found = []
    for engine in stack.registry.engines:
        with engine.connect() as conn:
            found += conn.execute(sa.text("SELECT job_id, state, started_at, error FROM runs")).all()
    return found


def _settled(stack: Stack) -> bool:
    import sqlalchemy as sa

    for engine in stack.registry.engines:
        with engine.connect() as conn:
            left = sa.text("SELECT count(*) FROM jobs WHERE state NOT IN ('completed', 'dead')")
            if conn.execute(left).scalar_one():
                return False
    return True


HELD = 'punctual_runs_total{outcome="held"}'


def scrape_counter(port: int, series: str) -> float:
    """One series of a worker's metrics (its main process serves the sum over its children)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " "))


def wait_serving_metrics(worker, port: int, timeout_s: float = 60) -> None:
    """Fail before the burst, not after it, if the worker serves no metrics."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            scrape_counter(port, HELD)
            return
        except OSError:
            if not worker.alive() or time.monotonic() > deadline:
                tail = worker.tail()
                raise SystemExit(f"bench: the worker serves no metrics on :{port}:\n{tail}") from None
            time.sleep(0.3)


def run(args) -> dict:
    from tests.e2e.processes import start_beat, start_worker, wait_ready

    sink = DelaySink(args.delay_ms / 1000)  # forked before any thread or connection
    metrics_port = free_port()
    overrides = parse_overrides(args.set)
    env: dict[str, str] = dict(overrides)
    if args.default_cap is not None:
        env["PUNCTUAL_TARGET_MAX_CONCURRENCY"] = str(args.default_cap)
    stack = Stack(physical=2, shards=16, broker=True, env=env)
    try:
        with stack:
            worker = start_worker(
                {**stack.env, "PUNCTUAL_METRICS_PORT": str(metrics_port)},
                stack.log_dir,
                concurrency=args.concurrency,
            )
            beat = start_beat(stack.env, stack.log_dir)
            stack.procs.extend([worker, beat])  # stopped by the stack's exit, before its databases go
            for proc in (worker, beat):
                wait_ready(proc, 0.5)
            wait_serving_metrics(worker, metrics_port)
            from tests.rows import insert_jobs, job_row, webhook_target

            limits = {}
            if args.cap or args.rate:
                limits = {
                    "key": "bench",
                    **({"max_concurrency": args.cap} if args.cap else {}),
                    **({"rate_per_s": args.rate} if args.rate else {}),
                }
            target = webhook_target(sink.url("/hook"), **({"limits": limits} if limits else {}))
            lead_s = args.lead_s or args.jobs / 5000 + 5 + stack.settings.claim_ahead_s
            due = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
            insert_jobs(
                stack.registry,
                [
                    job_row(16, owner=stack.owner, run_at=due, target=target, payload={"n": i})
                    for i in range(args.jobs)
                ],
            )
            print(
                f"due at              {due:%H:%M:%S} UTC ({due.timestamp():.0f}), "
                f"in {due.timestamp() - time.time():.1f} s",
                flush=True,
            )
            meter = CpuMeter(
                {"workers (celery)": [worker.pid], "beat": [beat.pid], "sink": [sink.pid]},
                services=tuple(SERVICES),
            )
            time.sleep(max(0.0, due.timestamp() - time.time() - stack.settings.claim_ahead_s - 2))
            meter.start()
            cpu_began = time.time()
            load_at_t = None
            deadline = due.timestamp() + args.timeout_s
            while time.time() < deadline:
                if load_at_t is None and time.time() >= due.timestamp():
                    load_at_t = os.getloadavg()
                if time.time() > due.timestamp() and _settled(stack):
                    break
                time.sleep(0.2)
            cpu_s, cpu_ended = meter.stop(), time.time()
            held = scrape_counter(metrics_port, HELD)
            runs = _count_runs(stack)
            settings = effective_settings(stack.env)
    finally:
        arrivals, peak = sink.seen() if sink._process.is_alive() else ([], 0)
        sink.close()

    t0 = due.timestamp()
    started = sorted(r.started_at.timestamp() - t0 for r in runs if r.started_at is not None)
    expired = sum(1 for r in runs if (r.error or "").startswith("lease expired"))
    runs_per_job = Counter(r.job_id for r in runs if r.started_at is not None)
    last = started[-1] if started else float("nan")
    result = {
        "jobs": args.jobs,
        "call_delay_ms": args.delay_ms,
        "cap": args.cap,
        "rate_per_s": args.rate,
        "calls_received": len(arrivals),
        "runs_started": len(started),
        "jobs_never_started": args.jobs - len(runs_per_job),
        "jobs_started_twice": sum(1 for c in runs_per_job.values() if c > 1),
        "run_states": dict(Counter(r.state for r in runs)),
        "first_start_after_due_s": round(started[0], 3) if started else None,
        "last_start_after_due_s": round(last, 3),
        "starts_per_s": round(len(started) / last, 1) if started and last > 0 else None,
        "start_lateness_s": lateness_figures(started),
        "peak_calls_in_flight_at_sink": peak,
        "held_back_to_registry": int(held),
        "held_counted_from": f"worker metrics port: {HELD}",
        "held_per_run": round(held / max(1, args.jobs), 3),
        "leases_expired": expired,
        "starts_per_second": per_second(started),
        "cpu_s": {**cpu_s, "window_s": round(cpu_ended - cpu_began, 1)},
        "cpu_ms_per_run": per_run_ms(cpu_s, len(started)),
        "settings": settings,
        "set_by_flag": overrides,
        "config": {"processes": args.concurrency, "registration": "direct insert"},
        "machine": {
            **machine(),
            "load_average_at_due": [round(x, 2) for x in (load_at_t or os.getloadavg())],
        },
    }
    if args.rate and started:
        window = [x for x in started if 1 <= x < 61]
        result["rate_delivered_first_minute"] = round(len(window) / 60, 2)
        result["rate_error"] = round(len(window) / 60 / args.rate - 1, 4)
    return result


def summary(r: dict) -> str:
    lines = [
        f"{r['jobs']:,} runs due at once, calls of {r['call_delay_ms']} ms, cap {r['cap'] or '-'}, rate "
        f"{r['rate_per_s'] or '-'}, default cap {r['settings']['PUNCTUAL_TARGET_MAX_CONCURRENCY']}"
        f"  (load {r['machine']['load_average_at_due'][0]} at T)",
        f"started             {r['runs_started']:,}  (calls {r['calls_received']:,}, "
        f"jobs never {r['jobs_never_started']}, jobs twice {r['jobs_started_twice']})",
        f"T -> first / last   {r['first_start_after_due_s']} s / {r['last_start_after_due_s']} s   "
        f"starts/s {r['starts_per_s']}",
        f"start lateness      p50 {r['start_lateness_s']['p50']} s  p99 {r['start_lateness_s']['p99']} s",
        f"peak in flight      {r['peak_calls_in_flight_at_sink']} (sink)",
        f"held to registry    {r['held_back_to_registry']:,} ({r['held_per_run']} per run)   leases expired "
        f"{r['leases_expired']}",
        "cpu ms per run      " + ", ".join(f"{k} {v}" for k, v in r["cpu_ms_per_run"].items()),
    ]
    if "rate_delivered_first_minute" in r:
        lines.append(
            f"rate delivered      {r['rate_delivered_first_minute']}/s over T+1..T+61 s "
            f"({100 * r['rate_error']:+.2f}%)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument(
        "--delay-ms", type=float, default=50, help="how long the sink takes to answer each call"
    )
    parser.add_argument("--cap", type=int, default=0, help="the jobs' own limits.max_concurrency (0 = none)")
    parser.add_argument("--rate", type=float, default=0, help="the jobs' own limits.rate_per_s (0 = none)")
    parser.add_argument(
        "--default-cap",
        type=int,
        default=None,
        help="PUNCTUAL_TARGET_MAX_CONCURRENCY (default: the shipped default)",
    )
    parser.add_argument("--concurrency", type=int, default=(os.cpu_count() or 1) + 1, help="worker processes")
    parser.add_argument("--lead-s", type=float, default=0)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--set", action="append", default=[], metavar="PUNCTUAL_X=Y")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    result = run(args)
    print(summary(result))
    print(f"result              {write_result('limits', result, args.label)}")


if __name__ == "__main__":
    main()
