"""Faults under a burst: what each one costs, on the production processes.

    python -m bench.faults [--jobs 3000] [--recurring 20] [--faults none,pg-cut,...]

For each fault, on a fresh stack (bench.common.Stack: new databases, vhost and Redis
prefix; the shipped defaults for every PUNCTUAL_* setting): two `celery -A app
worker`, one `celery -A app beat`; --jobs one-off jobs due at one instant T and
--recurring jobs every 2 s from T, all calling a local sink that records each
call's Idempotency-Key and Punctual-Attempt. The fault is injected while the burst
drains (tests/faults/injectors.py, the same faults as the fault tier), then the
bench waits for every one-off to be called and completed, and prints one row:

    lost                 one-offs never called (or not completed)
    duplicates           calls of an occurrence after its first (each must follow an expired lease)
    unexplained          duplicates that do not (must be 0)
    lease expired        runs the janitor took back ("lease expired")
    last call            the last one-off's first call, seconds after T
    recovery             how long after the fault's end the last never-called one-off was called
    settled              when the last one-off's outcome was written, seconds after T
    gap                  the largest gap between calls of a recurring job

Faults that stop or restart the machine's Postgres or RabbitMQ affect everything on
the box while they last. JSON goes to bench/results/faults-*.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

from bench.common import Stack, machine, shown, write_result
from tests.faults import injectors

SCENARIOS = {
    "none": lambda: None,
    "pg-cut": lambda: injectors.cut_postgres_connections(at_s=2.4, again_after_s=3.1),
    "pg-restart": lambda: injectors.restart_postgres(at_s=1.4),
    "pg-refuse": lambda: injectors.refuse_connections(at_s=1.5, down_s=15.0),
    "worker-kill": lambda: injectors.kill_worker(at_s=1.2, down_s=5.0),
    "rabbitmq-stop": lambda: injectors.stop_rabbitmq(at_s=3.5, down_s=15.0),
    "beat-kill": lambda: injectors.kill_beat(at_s=1.8, down_s=10.0),
    "worker-stop": lambda: injectors.stop_worker(at_s=1.5, stopped_s=70.0),
    "redis-kill": lambda: injectors.kill_redis_connections(at_s=1.5),
    "redis-pause": lambda: injectors.pause_redis(at_s=1.5, pause_s=4.0),
    "row-locks": lambda: injectors.hold_row_locks(at_s=-1.0, hold_s=8.0, rows=50),
    "two-beats": lambda: injectors.second_beat(),
}
DEFAULT = ("none", "pg-cut", "pg-restart", "worker-kill", "rabbitmq-stop", "beat-kill", "worker-stop")

COLUMNS = (
    ("fault", "fault", 60),
    ("lost", "lost", 5),
    ("duplicates", "dup", 5),
    ("unexplained_duplicates", "unexpl", 6),
    ("lease_expired", "expired", 7),
    ("last_one_off_call_s", "last call", 9),
    ("recovery_s", "recovery", 8),
    ("last_settled_s", "settled", 7),
    ("recurring_max_gap_s", "gap", 5),
)


def run_one(name: str, jobs: int, recurring: int, workers: int, env: dict[str, str]) -> dict:
    from tests.faults.harness import FaultStack, Load

    fault = SCENARIOS[name]()
    with Stack(physical=1, shards=16, broker=True, env=env) as stack:
        log_dir = Path(tempfile.mkdtemp(prefix=f"punctual-faults-{name}-"))
        processes = (os.cpu_count() or 1) + 1  # celeryconfig's default
        with FaultStack(stack.env, log_dir, stack.admin, workers=workers, concurrency=processes) as fs:
            load = Load(
                one_offs=jobs,
                spread_s=0.0,
                recurring=recurring,
                every_s=2,
                lead_s=12.0,
                call_delay_s=0.0,
                timeout_s=240.0,
            )
            outcome = fs.run(load, fault)
            settings = {f.name: getattr(fs.settings, f.name) for f in dataclasses.fields(fs.settings)}
            settings.pop("database_urls", None)
        row = outcome.row()
        row["scenario"] = name
        row["unexplained"] = outcome.verdict.unexplained[:20]
        row["settings"] = settings
        row["logs"] = str(log_dir)
        return row


def markdown(rows: list[dict]) -> str:
    head = (
        "| fault | lost | duplicate calls (after an expired lease) | unexplained "
        '| runs failed "lease expired" | last one-off call | recovery | settled '
        "| largest recurring gap |"
    )
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['fault']} | {r['lost']} | {r['duplicates']} | {r['unexplained_duplicates']} "
            f"| {r['lease_expired']} | T+{r['last_one_off_call_s']} s | {r['recovery_s']} s "
            f"| T+{r['last_settled_s']} s | {r['recurring_max_gap_s']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="one-off jobs due at T")
    parser.add_argument("--recurring", type=int, default=20, help="jobs every 2 s from T")
    parser.add_argument("--workers", type=int, default=2, help="`celery -A app worker` processes")
    parser.add_argument(
        "--faults", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=V",
        help="a setting other than the shipped default (recorded in the JSON)",
    )
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown fault {unknown[0]!r}; one of {', '.join(SCENARIOS)}")
    env = dict(item.split("=", 1) for item in args.env)
    rows = []
    print(
        "  ".join(
            f"{title:>{width}}" if key != "fault" else f"{title:<{width}}" for key, title, width in COLUMNS
        )
    )
    for name in names:
        row = run_one(name, args.jobs, args.recurring, args.workers, env)
        rows.append(row)
        print(
            "  ".join(
                f"{str(row[key]):>{width}}" if key != "fault" else f"{str(row[key])[:width]:<{width}}"
                for key, _, width in COLUMNS
            ),
            flush=True,
        )
    result = {
        "jobs": args.jobs,
        "recurring": args.recurring,
        "workers": args.workers,
        "env_overrides": env,
        "rows": rows,
        "machine": {**machine(), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    path = write_result("faults", result, args.label)
    print()
    print(markdown(rows))
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
