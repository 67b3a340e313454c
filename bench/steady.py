"""Steady state: 200 runs/s due, spread evenly, for 2 minutes; start lateness.

    python -m bench.steady [--rate 200] [--duration-s 120] [--set PUNCTUAL_X=Y ...]

Punctual as bench.burst starts it (bench/stack.py: the README's processes, the
shipped defaults unless --set), the nginx sink, registration through the API
before the window opens. The mix of jobs, each calling its own path /hook/<i>:

- one-off jobs: half the rate, run_at spread evenly (one every 1/(rate/2) s);
- interval jobs (interval_s 10, start_at staggered over the first 10 s): 45 %;
- cron jobs (`* * * * *`, UTC): 5 % on average, i.e. rate x 3 jobs firing together
  at each minute boundary, the way cron load arrives.

Start lateness of an occurrence = its first call's arrival at the sink - its
Punctual-Scheduled-For header, for every occurrence due inside the window. After
the window the bench waits until every such occurrence has called, or none has for
--stall-s (30 s); missing = those that never called by then (a late interval or
cron occurrence may also be skipped by its misfire policy). CPU-ms per run of each
component (bench/cpu.py, as bench.idle reads it) over that time, printed with the
total. JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from datetime import UTC, datetime

from bench.cpu import per_run_ms, with_own_total
from bench.figures import Arrival, lateness_figures
from bench.harness import (
    OWN_BACKENDS,
    due_instant,
    header,
    loadavg,
    sleep_until,
    stop_cleanly_on_sigterm,
    write_result,
)
from bench.nginx import NginxSink
from bench.register import register
from bench.stack import PunctualStack, parse_overrides

INTERVAL_S = 10
# How many of the latest first calls the figures list, with their instants.
WORST_SHOWN = 10


def iso(instant: float) -> str:
    return (
        datetime.fromtimestamp(round(instant, 3), UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def mix(url, start: float, duration_s: float, rate: float) -> tuple[list[dict], dict[str, int], list[str]]:
    """The jobs' bodies, the occurrences due in [start, end) by kind, and each job's kind.
    `url(i)` is job i's target URL."""
    end = start + duration_s
    bodies, kinds = [], []
    expected = {"once": 0, "interval": 0, "cron": 0}
    one_off_rate = rate * 0.5
    for n in range(int(one_off_rate * duration_s)):
        bodies.append({"name": f"steady-once-{n}", "schedule": {"run_at": iso(start + n / one_off_rate)}})
        kinds.append("once")
        expected["once"] += 1
    interval_jobs = int(rate * 0.45 * INTERVAL_S)
    for n in range(interval_jobs):
        first = round(start + INTERVAL_S * n / interval_jobs, 3)
        # end_at is inclusive: stop a millisecond short of the window's end.
        bodies.append(
            {
                "name": f"steady-interval-{n}",
                "schedule": {"interval_s": INTERVAL_S, "start_at": iso(first), "end_at": iso(end - 0.001)},
            }
        )
        kinds.append("interval")
        expected["interval"] += math.ceil((end - first) / INTERVAL_S)
    boundaries = sum(1 for m in range(math.ceil(start / 60) * 60, math.ceil(end), 60) if m < end)
    for n in range(int(rate * 3)):
        bodies.append(
            {
                "name": f"steady-cron-{n}",
                "schedule": {
                    "cron": "* * * * *",
                    "timezone": "UTC",
                    "start_at": iso(start),
                    "end_at": iso(end - 0.001),
                },
            }
        )
        kinds.append("cron")
        expected["cron"] += boundaries
    for i, body in enumerate(bodies):
        body.update(target={"type": "webhook", "url": url(i)}, payload={"n": i})
    return bodies, expected, kinds


def occurrence_figures(
    arrivals: list[Arrival], kinds: list[str], expected: dict[str, int], start: float, end: float
) -> dict:
    """First call per occurrence (Idempotency-Key) due in [start, end): lateness by kind,
    missing and duplicate calls."""
    first: dict[str, tuple[float, str, float]] = {}
    calls: dict[str, int] = defaultdict(int)
    for arrival in arrivals:
        if not arrival.scheduled_for:
            continue
        due = datetime.fromisoformat(arrival.scheduled_for.replace("Z", "+00:00")).timestamp()
        if not start <= due < end:
            continue
        calls[arrival.key] += 1
        kind = kinds[int(arrival.path.rsplit("/", 1)[1])]
        if arrival.key not in first or arrival.at - due < first[arrival.key][0]:
            first[arrival.key] = (arrival.at - due, kind, due)
    by_kind = {kind: [late for late, k, _due in first.values() if k == kind] for kind in expected}
    worst = sorted(first.values(), reverse=True)[:WORST_SHOWN]
    return {
        "occurrences_due": sum(expected.values()),
        "started": len(first),
        "missing": sum(expected.values()) - len(first),
        "duplicate_calls": sum(c - 1 for c in calls.values()),
        "lateness_s": lateness_figures([late for late, _k, _due in first.values()]),
        # The latest first calls, with their instants: which moment of the window they fell in.
        "latest": [{"due": iso(due), "kind": kind, "late_s": round(late, 3)} for late, kind, due in worst],
        "by_kind": {
            kind: {"due": expected[kind], "started": len(values), **lateness_figures(values)}
            for kind, values in by_kind.items()
        },
    }


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """The steady window's options (bench.prune runs the same window)."""
    parser.add_argument("--rate", type=float, default=200, help="runs due per second")
    parser.add_argument("--duration-s", type=float, default=120)
    parser.add_argument(
        "--lead-s", type=float, default=0, help="window opens now + this (default: jobs/300 + 20 s)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=Y",
        help="set one Punctual setting for every process (repeatable); all others are the defaults",
    )
    parser.add_argument(
        "--clients", type=int, default=16, help="registration threads when POST /jobs/batch is absent"
    )
    parser.add_argument("--install-sink", action="store_true", help="install nginx if missing (as root)")
    parser.add_argument(
        "--stall-s",
        type=float,
        default=30,
        help="after the window, stop waiting when nothing new calls this long",
    )


def run_window(stack: PunctualStack, sink: NginxSink, args, on_open=None, on_close=None) -> dict:
    """Register the mix, wait for its window, measure it; the figures of one steady run.
    `on_open()` / `on_close()` are called as the window opens and once it has closed."""
    jobs_estimate = args.rate * (0.5 * args.duration_s + 0.45 * INTERVAL_S + 3)
    start = due_instant(args.lead_s or jobs_estimate / 300 + 20)
    end = start + args.duration_s
    bodies, expected, kinds = mix(lambda i: sink.url(f"/hook/{i}"), start, args.duration_s, args.rate)
    print(f"registering {len(bodies):,} jobs; window {iso(start)} - {iso(end)}", flush=True)
    registration = register(stack.url, stack.api_key, bodies, clients=args.clients)
    print(
        f"registration: {registration['jobs_per_s']:,} jobs/s ({registration['way']}), "
        f"{registration['failures']} failures, done {start - time.time():.1f} s before the window",
        flush=True,
    )
    meter = stack.cpu_meter(sink.pid)
    sleep_until(start)
    meter.start()
    load_at_start = loadavg()
    if on_open:
        on_open()
    sleep_until(end)
    if on_close:
        on_close()
    # Occurrences due in the window that have not called yet are late, not lost:
    # wait until every one has called, or none has for --stall-s.
    due_total, last_count, last_change = sum(expected.values()), -1, time.time()
    while True:
        started = occurrence_figures(sink.arrivals(), kinds, expected, start, end)["started"]
        if started != last_count:
            last_count, last_change = started, time.time()
        if started >= due_total or time.time() - last_change > args.stall_s:
            break
        time.sleep(1)
    cpu_s = meter.stop()
    cpu_ended = time.time()
    load_at_end = loadavg()
    time.sleep(5)  # late duplicates, and the log's last flush
    figures = occurrence_figures(sink.arrivals(), kinds, expected, start, end)
    return dict(
        registration=registration,
        window={"start": iso(start), "end": iso(end)},
        **figures,
        achieved_starts_per_s=round(figures["started"] / args.duration_s, 1),
        cpu_s=cpu_s,
        cpu_ms_per_run=with_own_total(per_run_ms(cpu_s, figures["started"], not_in_total=(OWN_BACKENDS,))),
        cpu_window={
            "from": iso(start),
            "to": iso(cpu_ended),
            "note": "from the window's start until the last "
            "occurrence due in it called (or nothing new called for --stall-s)",
        },
        load_average={"start": load_at_start, "end": load_at_end},
    )


def print_figures(figures: dict, rate: float, duration_s: float) -> None:
    late = figures["lateness_s"]
    print(
        f"steady {rate:g}/s for {duration_s:g} s: {figures['started']:,} of "
        f"{figures['occurrences_due']:,} occurrences started, {figures['missing']} missing, "
        f"{figures['duplicate_calls']} duplicate calls"
    )
    print(
        f"start lateness p50 {late['p50']} s  p90 {late['p90']} s  p99 {late['p99']} s  max {late['max']} s"
        f"   (load {figures['load_average']['start'][0]} at start)"
    )
    for kind, kind_figures in figures["by_kind"].items():
        print(f"  {kind:9} {kind_figures}")
    print("CPU-ms per run: " + ", ".join(f"{name} {ms:g}" for name, ms in figures["cpu_ms_per_run"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steady", description=__doc__.split("\n\n")[0])
    add_window_arguments(parser)
    parser.add_argument("--out", help="write the JSON here instead of bench/results/")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    result = header("steady")
    overrides = parse_overrides(args.set)
    with NginxSink(install=args.install_sink) as sink, PunctualStack(overrides) as stack:
        figures = run_window(stack, sink, args)
        settings = stack.settings
    result.update(
        system="punctual",
        rate_per_s=args.rate,
        duration_s=args.duration_s,
        **figures,
        settings=settings,
        set_by_flag=overrides,
        processes=stack.commands,
    )
    path = write_result(result, "steady", f"{int(args.rate)}-{int(args.duration_s)}s", args.out)
    print_figures(figures, args.rate, args.duration_s)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
