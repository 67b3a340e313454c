"""A cron job's next occurrence alone: what one computation costs the process making it.

    python -m bench.occurrences [--calls 2000] [--repeat 5]

No services: the pure functions a run goes through, in this process. Figures, CPU
(time.process_time) per call, medians of --repeat measurements of --calls calls:

- next_fire, computed: every call a different instant, expression and zone (daily
  6-field, 5-field business hours, midnight in DST zones): nothing to reuse;
- next_fire, shared: the same expression, zone and instant each call, as the runs of
  a burst of daily jobs falling on one instant share them;
- a run's pure work, as the burst of `bench.burst` (a webhook job, no jitter, on time)
  makes it: the claim's plan (app.pollers.plan) and the completion's settlement of
  a success (app.lifecycle.settlement), for a one-off job and for a daily cron job
  of that burst; the cron job's `cron - one-off` is what its schedule adds to a run.

JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from statistics import median

from app.core.retries import CallOutcome
from app.core.schedules import DstPolicy, Schedule, next_fire
from app.lifecycle.settlement import Attempt, settle
from app.pollers.plan import plan_claim
from bench.common import machine, shown, write_result

T = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # Berlin's spring gap is hours away
ANCHOR = T - timedelta(days=1)
GRACE_S = 60.0
RETRY = {"max_attempts": 3, "backoff_s": 1.0, "max_backoff_s": 60.0}
VARIED = [
    ("0 30 0 * * *", "UTC"),
    ("0 9-17 * * mon-fri", "America/New_York"),
    ("0 0 * * *", "Europe/Berlin"),
    ("30 2 * * *", "Europe/Berlin"),
    ("*/15 * * * *", "Australia/Lord_Howe"),
]


def cpu_us_per_call(call: Callable[[int], object], calls: int, repeat: int) -> float:
    """Median over `repeat` of the CPU per call of call(0), ..., call(calls - 1)."""
    figures = []
    offset = 0
    for _ in range(repeat):
        started = time.process_time()
        for i in range(offset, offset + calls):
            call(i)
        figures.append((time.process_time() - started) / calls * 1e6)
        offset += calls
    return round(median(figures), 1)


def job_row(kind: str) -> dict:
    """A job row of the burst as the claim reads it: due at T, on time."""
    return {
        "job_id": uuid.uuid4(),
        "schedule_kind": kind,
        "run_at": T if kind == "once" else None,
        "cron": "0 30 0 * * *" if kind == "cron" else None,
        "timezone": "UTC",
        "interval_s": None,
        "start_at": None,
        "end_at": None,
        "dst_gap": "shift",
        "dst_overlap": "once",
        "misfire": "run_once",
        "misfire_exempt": False,
        "jitter_s": 0,
        "state": "running",
        "attempt": 0,
        "nominal_at": T,
        "next_run_at": T,
        "skipped_after": None,
        "skipped_through": None,
        "created_at": ANCHOR,
    }


def run_work(kind: str) -> Callable[[int], object]:
    """The claim's plan and the completion's settlement of one run of a `kind` job."""
    row = job_row(kind)
    attempt = Attempt(row["job_id"], "schedule", T, 1, RETRY)
    done = CallOutcome(status_code=200)

    def one_run(_i: int) -> object:
        plan_claim(row, T, GRACE_S)
        return settle(attempt, done, row, T + timedelta(seconds=1), lambda: 0.5)

    return one_run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.occurrences", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="measurements per figure (medians)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    dst = DstPolicy()
    varied = [Schedule(kind="cron", cron=text, timezone=zone) for text, zone in VARIED]
    shared = Schedule(kind="cron", cron="0 30 0 * * *", timezone="UTC")

    def computed(i: int) -> object:
        # A different instant every call (a second apart, each expression in turn).
        return next_fire(varied[i % len(varied)], dst, T + timedelta(seconds=i), ANCHOR)

    def reused(_i: int) -> object:
        return next_fire(shared, dst, T, ANCHOR)

    figures = {
        "next_fire_computed_us": cpu_us_per_call(computed, args.calls, args.repeat),
        "next_fire_shared_us": cpu_us_per_call(reused, args.calls, args.repeat),
        "run_one_off_us": cpu_us_per_call(run_work("once"), args.calls, args.repeat),
        "run_cron_us": cpu_us_per_call(run_work("cron"), args.calls, args.repeat),
    }
    figures["run_cron_extra_us"] = round(figures["run_cron_us"] - figures["run_one_off_us"], 1)
    labels = {
        "next_fire_computed_us": "next_fire, computed (every call another instant)",
        "next_fire_shared_us": "next_fire, shared (a burst's expression and instant)",
        "run_one_off_us": "a run's plan + settlement, one-off",
        "run_cron_us": "a run's plan + settlement, daily cron",
        "run_cron_extra_us": "  what the schedule adds to a run",
    }
    for key, label in labels.items():
        print(f"{label:<54}{figures[key]:8.1f} us CPU")
    path = write_result(
        "occurrences",
        {"calls": args.calls, "repeat": args.repeat, "figures": figures, "machine": machine()},
        args.label,
    )
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
