"""The midnight burst: N one-off webhook jobs due at the same instant T.

    python -m bench.burst --jobs 100000 [--workers 1] [--concurrency 3] [--shard-dsns DSN,DSN]

Builds the real stack (bench.common.Stack): fresh Postgres databases (or the
--shard-dsns given), a fresh RabbitMQ vhost and Redis prefix, `punctual api`,
`celery -A app worker` (--workers of them) and `celery -A app beat`; and a local
sink (bench/sink.py, its own process) that answers 200 and records each call's
arrival time and Idempotency-Key. Its own ceiling is measured first and printed.

The N jobs are registered through the API (--clients keep-alive connections),
all with run_at = T, T far enough ahead that registration ends first. Then the
bench waits for the calls and reports: fired, duplicates, missing, T to the last
start, starts/s, start lateness percentiles (runs.started_at - T, the API's
lateness_ms) and call lateness (arrival at the sink - T), Postgres commits and
rows written per run (pg_stat_database, pg_stat_user_tables), broker messages per
run (dispatch messages counted by the workers' metrics, polls from the beat
schedule), CPU seconds per component (/proc of each process tree). JSON and a PNG
go to bench/results/.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

from bench.common import (Connection, Stack, cpu_delta, cpu_snapshot, machine, pg_counters, percentile, scrape_counter,
                          service_roots, shown, write_result)
from bench.sink import FastSink

GOAL_STARTS_PER_S = 1700
CPU_LEAD_MARGIN_S = 5.0  # the CPU window opens PUNCTUAL_CLAIM_AHEAD_S + this before T


def job_body(sink_url: str, run_at: str, i: int) -> bytes:
    return json.dumps({
        "name": f"burst-{i}",
        "target": {"type": "webhook", "url": sink_url},
        "payload": {"n": i},
        "schedule": {"run_at": run_at},
    }).encode()


def _sink_load(args: tuple) -> int:
    port, calls = args
    conn = Connection("127.0.0.1", port)
    body = b'{"n": 1}'
    for i in range(calls):
        conn.post("/ceiling", {"Idempotency-Key": f"ceiling:{i}", "Content-Type": "application/json"}, body)
    conn.close()
    return calls


def sink_ceiling(sink: FastSink, calls: int = 20000, connections: int = 16) -> float:
    """Calls/s the sink answers from `connections` keep-alive clients in their own processes."""
    import multiprocessing

    port = int(sink.url("").rsplit(":", 1)[1])
    began = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(min(connections, 4)) as pool:
        done = sum(pool.map(_sink_load, [(port, calls // connections)] * connections))
    elapsed = time.perf_counter() - began
    sink.arrivals()  # forget them
    return done / elapsed


def _wait_calls(sink: FastSink, jobs: int, due: datetime, timeout_s: float, stall_s: float) -> None:
    deadline = time.time() + timeout_s
    base = sink.count  # the ceiling's calls are counted too
    last, last_change = -1, time.time()
    while sink.count - base < jobs:
        now = time.time()
        if sink.count != last:
            last, last_change = sink.count, now
        if now > deadline or now - max(last_change, due.timestamp()) > stall_s:
            print(f"  stopped waiting: {sink.count - base} of {jobs} calls")
            return
        time.sleep(0.05)


def _wait_settled(stack: Stack, timeout_s: float = 120) -> int:
    """Wait until no run is still claimed or running; returns how many are left."""
    import sqlalchemy as sa

    deadline = time.time() + timeout_s
    while True:
        left = 0
        for engine in stack.registry.engines:
            with engine.connect() as conn:
                left += conn.execute(sa.text("SELECT count(*) FROM runs WHERE state IN ('claimed', 'running')")).scalar_one()
        if left == 0 or time.time() > deadline:
            return left
        time.sleep(0.5)


def _runs(stack: Stack) -> list:
    import sqlalchemy as sa

    found = []
    for engine in stack.registry.engines:
        with engine.connect() as conn:
            found += conn.execute(sa.text(
                "SELECT job_id, state, started_at, lateness_ms, created_at, finished_at FROM runs")).all()
    return found


def per_second(offsets: list[float]) -> list[int]:
    if not offsets:
        return []
    bins = [0] * (int(max(offsets)) + 1)
    for x in offsets:
        if x >= 0:
            bins[int(x)] += 1
    return bins


def lateness_figures(values: list[float]) -> dict:
    return {"p50": round(percentile(values, 0.5), 3), "p90": round(percentile(values, 0.9), 3),
            "p99": round(percentile(values, 0.99), 3), "max": round(max(values), 3) if values else None}


def plot(path, starts: list[float], arrivals: list[float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, dist) = plt.subplots(1, 2, figsize=(13, 4.6))
    for offsets, label, style in ((starts, "runs started (registry)", "-"), (arrivals, "calls received (sink)", "--")):
        bins = per_second(offsets)
        rate.plot(range(len(bins)), bins, style, label=label, linewidth=1.4)
    rate.axhline(GOAL_STARTS_PER_S, color="grey", linestyle=":", label=f"goal {GOAL_STARTS_PER_S}/s")
    rate.set_xlabel("seconds after the due instant T")
    rate.set_ylabel("per second")
    rate.set_title("starts per second")
    rate.legend(loc="upper right", fontsize=8)
    rate.grid(alpha=0.3)
    ordered = sorted(starts)
    if ordered:
        dist.plot(ordered, [100 * (i + 1) / len(ordered) for i in range(len(ordered))], linewidth=1.4)
        for q, color in ((0.5, "tab:green"), (0.99, "tab:red")):
            value = percentile(ordered, q)
            dist.axvline(value, color=color, linestyle=":", label=f"p{int(q * 100)} {value:.1f} s")
    dist.axvline(60, color="grey", linestyle="--", label="goal p99 60 s")
    dist.set_xlabel("start lateness (s)")
    dist.set_ylabel("% of runs started by then")
    dist.set_title("start lateness, cumulative")
    dist.legend(loc="lower right", fontsize=8)
    dist.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(args) -> dict:
    load_before = os.getloadavg()
    sink = FastSink(record=True)  # forked before any thread or connection
    ceiling = sink_ceiling(sink)
    print(f"sink ceiling        {ceiling:,.0f} calls/s (16 keep-alive clients in 4 processes)")
    metrics_port = random.randint(20000, 40000)
    env = {"PUNCTUAL_POLL_INTERVAL_S": str(args.poll_interval_s), "PUNCTUAL_TARGET_MAX_CONCURRENCY": "0",
           "PUNCTUAL_DISPATCH_THREADS": str(args.threads)}
    if args.claim_batch:
        env["PUNCTUAL_CLAIM_BATCH"] = str(args.claim_batch)
    if args.claim_ahead_s is not None:
        env["PUNCTUAL_CLAIM_AHEAD_S"] = f"{args.claim_ahead_s:g}"
    if args.poll_budget_s:
        env["PUNCTUAL_POLL_BUDGET_S"] = str(args.poll_budget_s)
    stack = Stack(physical=args.physical, shards=args.shards, broker=True, env=env,
                  dsns=args.shard_dsns.split(",") if args.shard_dsns else None)
    try:
        with stack:
            stack.start_workers(args.workers, args.concurrency, metrics_port)
            stack.start_beat()
            stack.start_api(args.api_workers)
            from bench.create import measure

            # Registration must end before the claims ahead of T begin.
            ahead_s = stack.settings.claim_ahead_s
            lead_s = args.lead_s or (args.jobs / 5000 if args.direct else args.jobs / 500) + 10 + ahead_s
            due = (datetime.now(timezone.utc) + timedelta(seconds=lead_s)).replace(microsecond=0)
            body = functools.partial(job_body, sink.url("/burst"), due.isoformat().replace("+00:00", "Z"))
            if args.direct:  # the firing path alone: the API's rows, written straight into the registry
                from tests.rows import insert_jobs, job_row, webhook_target

                began = time.perf_counter()
                target = webhook_target(sink.url("/burst"))
                insert_jobs(stack.registry, [job_row(args.shards, owner=stack.owner, run_at=due, target=target,
                                                     payload={"n": i}) for i in range(args.jobs)])
                elapsed = time.perf_counter() - began
                registration = {"direct_insert": True, "jobs": args.jobs, "elapsed_s": round(elapsed, 3),
                                "jobs_per_s": round(args.jobs / elapsed, 1), "failures": 0, "clients": 0,
                                "latency_ms": {"p99": None}}
            else:
                print(f"registering         {args.jobs:,} jobs due at {due:%H:%M:%S} (in {lead_s:.0f} s), {args.clients} clients")
                registration = measure(stack.url, stack.api_key, args.clients, args.jobs, args.client_procs, body=body)
            registered_by = datetime.now(timezone.utc)
            print(f"registration        {registration['jobs_per_s']:,.0f} jobs/s, {registration['failures']} failures, "
                  f"done {(due - registered_by).total_seconds():.1f} s before T")
            # The measured window opens cpu_lead_s before T, whichever way the jobs came in,
            # so that it holds the claims made ahead of T (PUNCTUAL_CLAIM_AHEAD_S) and the
            # same stretch of polling in every run (it also lets the API's backends publish
            # their counts first).
            cpu_lead_s = stack.settings.claim_ahead_s + CPU_LEAD_MARGIN_S
            time.sleep(max(0.0, (due - datetime.now(timezone.utc)).total_seconds() - cpu_lead_s))
            table_roots = service_roots()
            roots = {"api (gunicorn)": [stack.server.pid], "workers (celery)": [w.pid for w in stack.workers],
                     "beat": [stack.beat.pid], "sink": [sink.pid],
                     **{name: [pid] for name, pid in table_roots.items()}}
            ports = [metrics_port + 100 * i + c for i in range(args.workers) for c in range(args.concurrency + 1)]
            cpu_before, cpu_began = cpu_snapshot(roots), time.time()
            pg_before = pg_counters(stack.dsns)
            messages_before = scrape_counter(ports, "punctual_dispatch_messages_total")
            time.sleep(max(0.0, due.timestamp() - time.time()))
            load_at_t = os.getloadavg()
            _wait_calls(sink, args.jobs, due, args.timeout_s, args.stall_s)
            calls_done = time.time()
            left = _wait_settled(stack)
            cpu_after, cpu_ended = cpu_snapshot(roots), time.time()
            messages_after = scrape_counter(ports, "punctual_dispatch_messages_total")
            time.sleep(11)  # idle backends publish their counts within 10 s
            pg_after = pg_counters(stack.dsns)
            load_after = os.getloadavg()
            runs = _runs(stack)
    finally:
        arrivals = sink.arrivals() if sink._process.is_alive() else []
        sink.close()

    t0 = due.timestamp()
    started = [r for r in runs if r.started_at is not None]
    start_offsets = [(r.started_at.timestamp() - t0) for r in started]
    arrival_offsets = [at - t0 for at, _key in arrivals]
    keys = Counter(key for _at, key in arrivals)
    runs_per_job = Counter(r.job_id for r in started)
    last_start = max(start_offsets) if start_offsets else float("nan")
    first_start = min(start_offsets) if start_offsets else float("nan")
    pg = {k: pg_after[k] - pg_before[k] for k in pg_after}
    fired = len(keys)
    dispatch_messages = messages_after - messages_before
    poll_messages = round(args.shards * (cpu_ended - cpu_began) / args.poll_interval_s)  # over the same window
    bins = per_second(start_offsets)
    result = {
        "jobs": args.jobs,
        "registration": registration,
        "registration_done_before_due_s": round((due - registered_by).total_seconds(), 1),
        "sink_ceiling_calls_per_s": round(ceiling),
        "fired": fired,
        "calls_received": len(arrivals),
        "duplicates": len(arrivals) - fired,
        "missing": args.jobs - fired,
        "runs_started": len(started),
        "jobs_started_twice_in_registry": sum(1 for c in runs_per_job.values() if c > 1),
        "runs_not_settled": left,
        "run_states": dict(Counter(r.state for r in runs)),
        "first_start_after_due_s": round(first_start, 3),
        "last_start_after_due_s": round(last_start, 3),
        "last_call_after_due_s": round(max(arrival_offsets), 3) if arrival_offsets else None,
        "last_claim_after_due_s": round(max(r.created_at.timestamp() for r in runs) - t0, 3) if runs else None,
        "starts_per_s": round(len(started) / last_start, 1) if start_offsets else None,
        "peak_starts_per_s": max(bins) if bins else 0,
        "start_lateness_s": lateness_figures([r.lateness_ms / 1000 for r in started]),
        "call_lateness_s": lateness_figures(arrival_offsets),
        "postgres": {**pg, "per_run": {k: round(v / max(1, len(started)), 3) for k, v in pg.items()},
                     "note": "deltas of the bench's databases from just before T to 11 s after the last completion"},
        "broker": {"dispatch_messages": int(dispatch_messages), "poll_messages_estimated": poll_messages,
                   "per_run": round((dispatch_messages + poll_messages) / max(1, len(started)), 4),
                   "note": "dispatch messages counted by the workers (punctual_dispatch_messages_total); "
                           "polls = shards x window / poll interval, from the beat schedule"},
        "cpu_s": {**cpu_delta(cpu_before, cpu_after), "window_s": round(cpu_ended - cpu_began, 1),
                  "window_from_due_s": round(cpu_began - due.timestamp(), 1),
                  "note": "process trees, from PUNCTUAL_CLAIM_AHEAD_S + 5 s before T (the claims made ahead included) until every "
                          "run settled; postgres/rabbitmq/redis are the whole shared services"},
        "starts_per_second": bins,
        "config": {"workers": args.workers, "processes_per_worker": args.concurrency, "dispatch_threads": args.threads,
                   "shards": args.shards, "physical_dsns": len(stack.dsns), "poll_interval_s": args.poll_interval_s,
                   "claim_batch": args.claim_batch or stack.settings.claim_batch,
                   "claim_ahead_s": stack.settings.claim_ahead_s, "api_workers": args.api_workers,
                   "poll_budget_s": stack.settings.poll_budget_s, "registration": "direct insert" if args.direct else "API"},
        "machine": {**machine(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_at_due": [round(x, 2) for x in load_at_t],
                    "load_average_after": [round(x, 2) for x in load_after]},
    }
    return result, start_offsets, arrival_offsets


def summary(result: dict) -> str:
    s, c, pg, br = result["start_lateness_s"], result["call_lateness_s"], result["postgres"], result["broker"]
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in result["cpu_s"].items() if isinstance(v, float) and not k.startswith("window"))
    reg = result["registration"]
    return "\n".join([
        f"burst of {result['jobs']:,} one-off jobs due at one instant  (load {result['machine']['load_average_at_due'][0]} at T)",
        (f"registration        {reg['jobs_per_s']:,.0f} jobs/s written straight into the registry (--direct)"
         if reg.get("direct_insert") else
         f"registration        {reg['jobs_per_s']:,.0f} jobs/s via the API, {reg['clients']} clients, p99 {reg['latency_ms']['p99']} ms"),
        f"sink ceiling        {result['sink_ceiling_calls_per_s']:,} calls/s",
        f"fired               {result['fired']:,}   duplicates {result['duplicates']}   missing {result['missing']}"
        f"   (registry: {result['runs_started']:,} started, {result['jobs_started_twice_in_registry']} jobs twice)",
        f"T -> last start     {result['last_start_after_due_s']} s   (first {result['first_start_after_due_s']} s,"
        f" last call {result['last_call_after_due_s']} s)",
        f"starts/s            {result['starts_per_s']:,} sustained, {result['peak_starts_per_s']:,} peak second"
        f"   (goal >= {GOAL_STARTS_PER_S:,})",
        f"start lateness      p50 {s['p50']} s  p90 {s['p90']} s  p99 {s['p99']} s  max {s['max']} s   (goal p99 <= 60 s)",
        f"call lateness       p50 {c['p50']} s  p90 {c['p90']} s  p99 {c['p99']} s  max {c['max']} s",
        f"postgres per run    {pg['per_run']['xact_commit']} commits, {pg['per_run']['n_tup_ins']} ins,"
        f" {pg['per_run']['n_tup_upd']} upd, {pg['per_run']['n_tup_del']} del",
        f"broker per run      {br['per_run']} messages ({br['dispatch_messages']:,} dispatch + ~{br['poll_messages_estimated']:,} polls)",
        f"cpu seconds         {cpu}  (over {result['cpu_s']['window_s']} s from T{result['cpu_s']['window_from_due_s']:+} s)",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--shard-dsns", help="comma-separated Postgres DSNs to use (migrated here) instead of fresh databases")
    parser.add_argument("--physical", type=int, default=2, help="fresh databases to make without --shard-dsns")
    parser.add_argument("--workers", type=int, default=1, help="`celery -A app worker` processes")
    parser.add_argument("--concurrency", type=int, default=(os.cpu_count() or 1) + 1, help="prefork processes per worker")
    parser.add_argument("--threads", type=int, default=256, help="PUNCTUAL_DISPATCH_THREADS per process")
    parser.add_argument("--claim-batch", type=int, default=0, help="PUNCTUAL_CLAIM_BATCH (default: the setting's)")
    parser.add_argument("--claim-ahead-s", type=float, default=None,
                        help="PUNCTUAL_CLAIM_AHEAD_S (default: the setting's)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--poll-interval-s", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=16, help="concurrent registration clients")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--api-workers", type=int, default=None, help="gunicorn workers (default: the CLI's)")
    parser.add_argument("--lead-s", type=float, default=0,
                        help="T = now + this (default: jobs/500, or jobs/5000 with --direct, + 10 s + the claim-ahead window)")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--stall-s", type=float, default=90, help="give up when no call arrives for this long after T")
    parser.add_argument("--direct", action="store_true",
                        help="write the jobs straight into the registry instead of through the API (A/B runs of the firing path)")
    parser.add_argument("--poll-budget-s", type=float, default=0, help="PUNCTUAL_POLL_BUDGET_S (default: the setting's)")
    parser.add_argument("--label", default="", help="added to the result file names")
    args = parser.parse_args()
    result, starts, arrivals = run(args)
    label = f"{args.jobs}{'-' + args.label if args.label else ''}"
    path = write_result("burst", result, label)
    png = path.with_suffix(".png")
    plot(png, starts, arrivals, f"{args.jobs:,} jobs due at one instant: {result['starts_per_s']}/s sustained, "
         f"p99 start lateness {result['start_lateness_s']['p99']} s ({result['at']}, 2 cores, load "
         f"{result['machine']['load_average_at_due'][0]} at T)")
    print(summary(result))
    print(f"written to {shown(path)} and {shown(png)}")


if __name__ == "__main__":
    main()
