"""Fair between owners: one owner's burst against another owner's jobs.

    python -m bench.fairness late [--jobs 100000] [--late-jobs 10] [--late-after-s 3]
                                  [--share-target | --same-target] [--delay-ms 0] [--workers 1]
    python -m bench.fairness many [--owners 1000] [--jobs-per-owner 100]

The real stack (bench.common.Stack: fresh databases, vhost and Redis prefix; --workers
`celery -A app worker`, one `celery -A app beat`) on the shipped defaults, except
PUNCTUAL_ALLOW_PRIVATE_TARGETS=1 (the sink is local) and what --set gives; the test
suite's sink (tests.sink.Sink, in this process) answers 200, after --delay-ms. The
jobs are written straight into the registry (tests.rows), not through the API:
registering 100,000 through the API takes minutes here and is not what is measured.
Lateness = runs.started_at - the run's instant; for B (late) also when its calls
reached the sink, since a run waits for its target's concurrency cap after its start.

- late: owner A has --jobs one-off jobs due at T, owner B --late-jobs due at
  T + --late-after-s, calling another target (`localhost` instead of `127.0.0.1`;
  --same-target: A's, so B's calls wait in the target's concurrency cap with A's;
  --share-target: both cases, one after the other on fresh stacks, reported side by
  side). Goal: B's start lateness <= 2 s while A drains.
- many: --owners owners with --jobs-per-owner jobs each, all due at T. Goal: every
  owner's p99 lateness within 1.2x of the overall p99.

--analyze runs ANALYZE once the jobs are in, as autovacuum would on a server that
runs it (this box's does not; the result records the server's setting).

JSON to bench/results/, with every PUNCTUAL_* value in effect.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from bench.common import Stack, machine, shown, write_result


def percentile(values, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _insert(stack: Stack, owner: str, count: int, due: datetime, url: str) -> None:
    from tests.rows import insert_jobs, job_row, webhook_target

    target = webhook_target(url)
    insert_jobs(
        stack.registry, [job_row(stack.shards, owner=owner, run_at=due, target=target) for _ in range(count)]
    )


def _started(stack: Stack) -> list:
    import sqlalchemy as sa

    from app.registry.schema import runs

    rows = []
    for engine in stack.registry.engines:
        with engine.connect() as conn:
            query = sa.select(
                runs.c.job_id, runs.c.owner, runs.c.scheduled_for, runs.c.started_at, runs.c.created_at
            )
            rows += conn.execute(query.where(runs.c.started_at.isnot(None))).all()
    return rows


def _wait_started(stack: Stack, total: int, timeout_s: float) -> None:
    import sqlalchemy as sa

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = 0
        for engine in stack.registry.engines:
            with engine.connect() as conn:
                started += conn.execute(
                    sa.text("SELECT count(DISTINCT job_id) FROM runs WHERE started_at IS NOT NULL")
                ).scalar_one()
        if started >= total:
            return
        time.sleep(1)
    raise TimeoutError(f"{started} of {total} jobs started in {timeout_s} s")


def _figures(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 0.50), 3),
        "p99_s": round(percentile(values, 0.99), 3),
        "max_s": round(max(values), 3),
    }


def _per_window(offsets: list[float], window_s: float) -> list[int]:
    """How many of `offsets` (seconds from T) fall in each window from T on (earlier
    ones count in the first)."""
    counts = [0] * (int(max(offsets, default=0.0) // window_s) + 1)
    for offset in offsets:
        counts[int(max(0.0, offset) // window_s)] += 1
    return counts


def run(args, same_target: bool = False) -> dict:
    from app.services.owners import create_key
    from tests.e2e.processes import start_beat, start_worker, wait_ready
    from tests.sink import Answer, Sink

    sink = Sink(record=lambda path: path == "/fair/b")  # B's calls only: A's are counted
    env = dict(kv.split("=", 1) for kv in args.set)
    env.setdefault("PUNCTUAL_ALLOW_PRIVATE_TARGETS", "1")
    stack = Stack(physical=1, shards=16, broker=True, env=env)
    try:
        with stack:
            for path in ("/fair/a", "/fair/b"):
                sink.script(path, [Answer(200, delay_s=args.delay_ms / 1000)])
            if args.scenario == "late":
                owners = {"a": args.jobs, "b": args.late_jobs}
            else:
                owners = {f"owner-{i:04}": args.jobs_per_owner for i in range(args.owners)}
            total = sum(owners.values())
            lead_s = stack.settings.claim_ahead_s + 10 + total / 5000
            due = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
            for owner, count in owners.items():
                create_key(stack.registry, owner)
                late = args.late_after_s if args.scenario == "late" and owner == "b" else 0
                # B calls another target (the same sink by another name) unless told to share
                # A's: a target's concurrency cap is shared by every owner calling it.
                url = sink.url("/fair/b" if owner == "b" else "/fair/a")
                own = owner == "b" and not same_target
                _insert(
                    stack,
                    owner,
                    count,
                    due + timedelta(seconds=late),
                    url.replace("127.0.0.1", "localhost") if own else url,
                )
            if args.analyze:  # what autovacuum does on a box where it runs, before the burst
                for engine in stack.registry.engines:
                    with engine.begin() as conn:
                        conn.exec_driver_sql("ANALYZE jobs")
                        conn.exec_driver_sql("ANALYZE runs")
            procs = [
                *(
                    start_worker(stack.env, stack.log_dir, name=f"worker-{n}", concurrency=args.concurrency)
                    for n in range(args.workers)
                ),
                start_beat(stack.env, stack.log_dir),
            ]
            stack.procs.extend(procs)  # stopped by the stack's exit, before its databases go
            for proc in procs:
                wait_ready(proc, 0.5)
            print(f"{total:,} jobs of {len(owners):,} owners, due at {due:%H:%M:%S}", flush=True)
            time.sleep(max(0.0, due.timestamp() - time.time()))
            load_at_t = os.getloadavg()
            _wait_started(stack, total, args.timeout_s)
            runs = _started(stack)
            settings = {k: v for k, v in stack.env.items() if k.startswith("PUNCTUAL_")}
            settings.update(
                {
                    f"PUNCTUAL_{name.upper()}": value
                    for name, value in vars(stack.settings).items()
                    if f"PUNCTUAL_{name.upper()}" not in settings and name not in ("database_urls",)
                }
            )
    finally:
        sink.close()

    first: dict = {}
    for row in runs:  # the first start of each job (a lease expiry may start one twice)
        key = (row.owner, row.job_id)
        if key not in first or row.started_at < first[key][1]:
            first[key] = (row.scheduled_for, row.started_at)
    lateness: dict[str, list[float]] = defaultdict(list)
    starts: dict[str, list[float]] = defaultdict(list)
    for (owner, _), (scheduled, started) in first.items():
        lateness[owner].append((started - scheduled).total_seconds())
        starts[owner].append((started - due).total_seconds())
    every = [x for values in lateness.values() for x in values]
    result: dict = {
        "scenario": args.scenario,
        "analyzed_before_t": bool(args.analyze),
        "same_target": same_target,
        "workers": args.workers,
        "target_delay_ms": args.delay_ms,
        "owners": len(owners),
        "jobs": total,
        "overall": _figures(every),
        "drain_s": round(max(x for values in starts.values() for x in values), 3),
        # When the claim made the runs, from T (negative: claimed ahead), and the starts
        # in each 10 s from T: a drain held back by its claim shows here.
        "claimed_s": _figures([(row.created_at - due).total_seconds() for row in runs]),
        "starts_per_10s": _per_window([x for values in starts.values() for x in values], 10.0),
        "settings": settings,
        "machine": {**machine(), "load_average_at_t": [round(x, 2) for x in load_at_t]},
    }
    if args.scenario == "late":
        b_started = sorted(starts["b"])
        result["a"] = _figures(lateness["a"])
        result["b"] = _figures(lateness["b"])
        b_due = due.timestamp() + args.late_after_s
        result["b_called"] = _figures([call.at - b_due for call in sink.calls("/fair/b")])
        result["a_started_before_b_s"] = sum(1 for x in starts["a"] if x < b_started[-1])
        result["goal_b_max_lateness_s"] = 2.0
        print(
            f"A: {args.jobs:,} jobs, p50 {result['a']['p50_s']:.2f} s, p99 {result['a']['p99_s']:.2f} s, "
            f"drained {result['drain_s']:.1f} s after T\n"
            f"B (on {'A' + chr(39) + 's' if same_target else 'another'} host): "
            f"{args.late_jobs} jobs due T+{args.late_after_s:g} s: "
            f"lateness max {result['b']['max_s']:.2f} s, called {result['b_called']['max_s']:.2f} s "
            f"after their instant at most (goal <= 2 s); {result['a_started_before_b_s']:,} of A's "
            "had started by then"
        )
    else:
        per_owner = {owner: percentile(values, 0.99) for owner, values in lateness.items()}
        worst = max(per_owner.values())
        overall = result["overall"]["p99_s"]
        result["per_owner_p99_s"] = {
            "max": round(worst, 3),
            "median": round(percentile(list(per_owner.values()), 0.50), 3),
            "min": round(min(per_owner.values()), 3),
        }
        result["worst_owner_p99_over_overall_p99"] = round(worst / overall, 3) if overall else None
        result["goal_ratio"] = 1.2
        print(
            f"{len(owners):,} owners x {args.jobs_per_owner}: overall p99 {overall:.2f} s; per-owner p99 "
            f"min {result['per_owner_p99_s']['min']:.2f} median {result['per_owner_p99_s']['median']:.2f} "
            f"max {worst:.2f} s = {result['worst_owner_p99_over_overall_p99']}x overall (goal <= 1.2x); "
            f"drained {result['drain_s']:.1f} s after T"
        )
    claimed = result["claimed_s"]
    print(
        f"claimed from T: p50 {claimed['p50_s']:.1f} s, max {claimed['max_s']:.1f} s; "
        f"starts per 10 s: {result['starts_per_10s']}"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=("late", "many"))
    parser.add_argument("--jobs", type=int, default=100_000, help="late: owner A's jobs due at T")
    parser.add_argument("--late-jobs", type=int, default=10, help="late: owner B's jobs")
    parser.add_argument(
        "--late-after-s", type=float, default=3.0, help="late: B's jobs are due this long after T"
    )
    targets = parser.add_mutually_exclusive_group()
    targets.add_argument(
        "--same-target",
        action="store_true",
        help="late: B calls the same target as A (by default another host name of the sink)",
    )
    targets.add_argument(
        "--share-target",
        action="store_true",
        help="late: B on another host, then B on A's host (fresh stacks), side by side",
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the target answers after this long")
    parser.add_argument("--owners", type=int, default=1000, help="many: owners")
    parser.add_argument(
        "--jobs-per-owner", type=int, default=100, help="many: jobs of each owner, all due at T"
    )
    parser.add_argument(
        "--concurrency", type=int, default=(os.cpu_count() or 1) + 1, help="processes of each worker"
    )
    parser.add_argument("--workers", type=int, default=1, help="workers, each on every queue")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the registry once the jobs are in, as autovacuum would (this box runs without it)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=V",
        help="a setting other than the shipped default (repeatable)",
    )
    args = parser.parse_args()
    if args.scenario == "late" and args.share_target:
        cases = {"another host": run(args, same_target=False), "A's host": run(args, same_target=True)}
        result = {"scenario": "late", "share_target": True, "cases": cases}
        for name, case in cases.items():
            called = case["b_called"]
            print(
                f"B on {name + ':':<13} called p50 {called['p50_s']:.2f} s, max {called['max_s']:.2f} s "
                f"after their instant (goal <= 2 s); A drained {case['drain_s']:.1f} s after T"
            )
    else:
        result = run(args, same_target=args.same_target)
    path = write_result("fairness", result, label=args.scenario)
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
