"""The burst: N one-off webhook jobs due at one instant T, Punctual as a user runs it.

    python -m bench.burst --jobs 20000 [--cron] [--set PUNCTUAL_X=Y ...] [--plot]

Punctual runs as the README's "Production topology" says (bench/stack.py:
`punctual migrate`, `punctual api`, `celery -A app beat`, one `celery -A app
worker -Q shard-00,...`) on a fresh database, vhost and Redis prefix, with the
shipped defaults: only the DSN, broker, Redis and PUNCTUAL_ALLOW_PRIVATE_TARGETS=1
are set, and what --set adds. The jobs are registered through the HTTP API before
T (bench/register.py), each a webhook to its own path /hook/<i> on nginx
(bench/nginx.py). Figures come from the sink's access log (bench/figures.py) and
/proc (bench/cpu.py); the JSON, which records every PUNCTUAL_* in effect, goes to
bench/results/ (or --out).

--cron makes each job a daily cron occurrence falling on T (6 fields, seconds first, UTC)
instead of a one-off, so each run also computes its job's next occurrence.

--analyze runs ANALYZE on the registry once the jobs are in, before T: what
autovacuum, on by default in PostgreSQL, has done by a midnight whose jobs were
registered during the day. This box's PostgreSQL runs without it, so without the
flag the planner works from tables never analyzed (bench/README.md).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from bench.harness import (
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
from bench.register import register
from bench.stack import PunctualStack, analyze, parse_overrides

REGISTRATION_RATE_GUESS = 200  # jobs/s via POST /jobs on a busy 2-core box: T far enough ahead


def job_body(sink: NginxSink, due: datetime, i: int, cron: bool = False) -> dict:
    """Job i of the burst: a one-off due at `due`, or (`cron`) a daily occurrence of a
    6-field cron expression (seconds first) that falls on `due`, so that each run also
    computes the job's next occurrence."""
    if cron:
        schedule: dict = {"cron": f"{due.second} {due.minute} {due.hour} * * *", "timezone": "UTC"}
    else:
        schedule = {"run_at": due.isoformat().replace("+00:00", "Z")}
    return {
        "name": f"burst-{i}",
        "target": {"type": "webhook", "url": sink.url(f"/hook/{i}")},
        "payload": {"n": i},
        "schedule": schedule,
    }


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs due at the one instant T")
    parser.add_argument(
        "--lead-s",
        type=float,
        default=0,
        help="T = now + this (default: jobs/200 s for registration + the CPU window's lead + 10 s)",
    )
    parser.add_argument("--timeout-s", type=float, default=900, help="stop waiting this long after T")
    parser.add_argument(
        "--stall-s", type=float, default=90, help="stop waiting when no new job starts for this long"
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=5,
        help="keep reading the sink this long after the last job started (late duplicates)",
    )
    parser.add_argument(
        "--install-sink",
        action="store_true",
        help="install nginx from Debian's packages if it is missing (as root)",
    )
    parser.add_argument(
        "--plot", action="store_true", help="also draw starts per second as a PNG beside the JSON"
    )
    parser.add_argument("--label", default="", help="added to the result file's name")
    parser.add_argument("--out", help="write the JSON here instead of bench/results/")


def run(args: argparse.Namespace) -> dict:
    result = header("burst")
    overrides = parse_overrides(args.set)
    with NginxSink(install=args.install_sink) as sink, PunctualStack(overrides) as stack:
        claim_ahead_s = float(stack.settings["PUNCTUAL_CLAIM_AHEAD_S"])
        window_lead_s = max(WINDOW_LEAD_S, claim_ahead_s + 5)
        lead_s = args.lead_s or args.jobs / REGISTRATION_RATE_GUESS + window_lead_s + 10
        due = due_instant(lead_s)
        due_at = datetime.fromtimestamp(due, UTC)
        due_iso = due_at.isoformat().replace("+00:00", "Z")
        print(
            f"registering {args.jobs:,} jobs due at {due_iso} (in {due - datetime.now().timestamp():.0f} s)",
            flush=True,
        )
        registration = register(
            stack.url,
            stack.api_key,
            [job_body(sink, due_at, i, cron=args.cron) for i in range(args.jobs)],
            clients=args.clients,
        )
        registered_at = datetime.now().timestamp()
        print(
            f"registration: {registration['jobs_per_s']:,} jobs/s ({registration['way']}), "
            f"{registration['failures']} failures, done {due - registered_at:.1f} s before T",
            flush=True,
        )
        if args.analyze:
            analyze(stack.database, ("jobs", "runs"))
        meter = stack.cpu_meter(sink.pid)
        figures = measure_burst(
            sink,
            args.jobs,
            due,
            meter,
            window_lead_s=window_lead_s,
            timeout_s=args.timeout_s,
            stall_s=args.stall_s,
            settle_s=args.settle_s,
            registered_at=registered_at,
        )
        result.update(
            system="punctual",
            registration=registration,
            **figures,
            settings=stack.settings,
            set_by_flag=overrides,
            analyzed_before_t=bool(args.analyze),
            schedule="daily cron falling on T" if args.cron else "run_at T",
            processes=stack.commands,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
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
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the registry once the jobs are in, before T, as autovacuum would (this box has it off)",
    )
    parser.add_argument(
        "--cron",
        action="store_true",
        help="each job a daily 6-field cron expression falling on T instead of a one-off run_at T",
    )
    stop_cleanly_on_sigterm()
    args = parser.parse_args()
    result = run(args)
    path = write_result(result, "burst", f"{args.jobs}{'-' + args.label if args.label else ''}", args.out)
    print(summary(result))
    print(f"written to {path}")
    if args.plot:
        print(f"plot: {plot(path, result)}")


if __name__ == "__main__":
    main()
