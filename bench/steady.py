"""Steady state: 200 runs/s due, spread evenly, for 2 minutes; start lateness.

    python -m bench.steady [--rate 200] [--duration-s 120]

The real stack (bench.common.Stack: fresh databases, vhost, Redis prefix,
`celery -A app worker` and `celery -A app beat`, poll interval 1 s) and the
recording sink. The jobs are written straight into the registry before the
window opens (the API's rows; registration is bench.create's and bench.burst's
business), mixed:

- one-off jobs: half the rate, run_at spread evenly (a new one every 1/(rate/2) s);
- interval jobs (interval_s 10, start_at staggered over the 10 s): 45 % of the rate;
- cron jobs (`* * * * *`): 5 % of the rate on average, i.e. rate x 3 jobs firing
  together at each minute boundary, the way cron load arrives.

Start lateness = runs.started_at - scheduled_for (the API's lateness_ms), for every
occurrence due inside the window. JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

from bench.common import Stack, machine, percentile, shown, write_result
from bench.sink import FastSink


def job_rows(owner: str, target: dict, start: datetime, duration_s: float, rate: float) -> list[dict]:
    from tests.rows import job_row

    end = start + timedelta(seconds=duration_s)
    rows = []
    one_off_rate = rate * 0.5
    for i in range(int(one_off_rate * duration_s)):
        at = start + timedelta(seconds=i / one_off_rate)
        rows.append(job_row(16, owner=owner, target=target, run_at=at.replace(microsecond=at.microsecond // 1000 * 1000),
                            payload={"kind": "once", "n": i}))
    interval_jobs = int(rate * 0.45 * 10)
    for i in range(interval_jobs):
        first = start + timedelta(seconds=10 * i / interval_jobs)
        first = first.replace(microsecond=first.microsecond // 1000 * 1000)
        rows.append(job_row(16, owner=owner, target=target, interval_s=10, start_at=first, end_at=end, first=first,
                            payload={"kind": "interval", "n": i}))
    minute = (start + timedelta(seconds=59)).replace(second=0, microsecond=0)
    if minute < end:
        for i in range(int(rate * 3)):
            rows.append(job_row(16, owner=owner, target=target, cron="* * * * *", end_at=end, first=minute,
                                payload={"kind": "cron", "n": i}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steady", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200, help="runs due per second")
    parser.add_argument("--duration-s", type=float, default=120)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=(os.cpu_count() or 1) + 1)
    parser.add_argument("--poll-interval-s", type=float, default=1.0)
    parser.add_argument("--lead-s", type=float, default=10)
    args = parser.parse_args()
    load_before = os.getloadavg()
    sink = FastSink(record=True)
    env = {"PUNCTUAL_POLL_INTERVAL_S": str(args.poll_interval_s), "PUNCTUAL_TARGET_MAX_CONCURRENCY": "0"}
    try:
        with Stack(physical=2, broker=True, env=env) as stack:
            from tests.rows import insert_jobs, webhook_target

            stack.start_workers(args.workers, args.concurrency)
            stack.start_beat()
            start = (datetime.now(timezone.utc) + timedelta(seconds=args.lead_s)).replace(microsecond=0)
            end = start + timedelta(seconds=args.duration_s)
            rows = job_rows(stack.owner, webhook_target(sink.url("/steady")), start, args.duration_s, args.rate)
            insert_jobs(stack.registry, rows)
            print(f"{len(rows):,} jobs ({dict(Counter(r['schedule_kind'] for r in rows))}), window "
                  f"{start:%H:%M:%S}-{end:%H:%M:%S}", flush=True)
            load_at_start = None
            while datetime.now(timezone.utc) < end + timedelta(seconds=5):
                if load_at_start is None and datetime.now(timezone.utc) >= start:
                    load_at_start = os.getloadavg()
                time.sleep(0.5)
            time.sleep(5)  # calls and completions of the last second
            import sqlalchemy as sa

            found = []
            for engine in stack.registry.engines:
                with engine.connect() as conn:
                    found += conn.execute(sa.text(
                        "SELECT runs.job_id, runs.scheduled_for, runs.started_at, runs.lateness_ms, runs.state,"
                        " jobs.schedule_kind FROM runs JOIN jobs USING (job_id)"
                        " WHERE runs.scheduled_for >= :start AND runs.scheduled_for < :end"),
                        {"start": start, "end": end}).all()
    finally:
        arrivals = sink.arrivals()
        sink.close()
    started = [r for r in found if r.started_at is not None]
    lateness = [r.lateness_ms / 1000 for r in started]
    by_kind = {}
    for kind in ("once", "interval", "cron"):
        values = [r.lateness_ms / 1000 for r in started if r.schedule_kind == kind]
        if values:
            by_kind[kind] = {"runs": len(values), "p50_s": round(percentile(values, 0.5), 3),
                             "p99_s": round(percentile(values, 0.99), 3), "max_s": round(max(values), 3)}
    keys = Counter(key for _at, key in arrivals)
    result = {
        "rate_per_s": args.rate, "duration_s": args.duration_s, "poll_interval_s": args.poll_interval_s,
        "occurrences_due": len(found), "runs_started": len(started),
        "calls_received": len(arrivals), "duplicate_calls": sum(c - 1 for c in keys.values()),
        "achieved_starts_per_s": round(len(started) / args.duration_s, 1),
        "start_lateness_s": {"p50": round(percentile(lateness, 0.5), 3), "p90": round(percentile(lateness, 0.9), 3),
                             "p99": round(percentile(lateness, 0.99), 3), "max": round(max(lateness), 3) if lateness else None},
        "by_kind": by_kind,
        "config": {"workers": args.workers, "processes_per_worker": args.concurrency, "physical_dsns": 2, "shards": 16},
        "machine": {**machine(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_at_start": [round(x, 2) for x in (load_at_start or os.getloadavg())],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    path = write_result("steady", result, f"{int(args.rate)}-{int(args.duration_s)}s")
    s = result["start_lateness_s"]
    print(f"steady {args.rate:g}/s for {args.duration_s:g} s: {len(started):,} of {len(found):,} occurrences started "
          f"({result['achieved_starts_per_s']}/s), {result['duplicate_calls']} duplicate calls")
    print(f"start lateness p50 {s['p50']} s  p90 {s['p90']} s  p99 {s['p99']} s  max {s['max']} s   (goal p99 < 1.5 s)")
    for kind, figures in by_kind.items():
        print(f"  {kind:9} {figures}")
    print(f"load average {result['machine']['load_average_at_start'][0]} at start; written to {shown(path)}")


if __name__ == "__main__":
    main()
