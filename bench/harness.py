"""What every burst benchmark shares, Punctual's and the peers': the due instant, the
measured window, the wait for the sink's arrivals, and the result file.

The scheme: N jobs, all due at one instant T, each calling its own path
/hook/<i> on the nginx sink. The CPU window runs from T - 15 s (or earlier when
the system claims further ahead) to the moment the last job's first call is seen.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import postgres_setting
from bench.cpu import OWN_BACKENDS, CpuMeter, per_run_ms, with_own_total
from bench.figures import burst_figures
from bench.nginx import NginxSink

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]
WINDOW_LEAD_S = 15.0


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: the `with` blocks stop the processes and drop the
    database and vhost they made."""

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def commit() -> dict:
    """The commit measured and whether tracked code differed from it."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD"),
            # Documents and result files do not change what runs.
            "dirty": bool(
                git(
                    "status",
                    "--porcelain",
                    "--untracked-files=no",
                    "--",
                    ".",
                    ":(exclude)*.md",
                    ":(exclude)bench/results",
                )
            ),
        }
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "note": "one box: Postgres, RabbitMQ, Redis, nginx, the system measured and the bench share its "
        "cores; Postgres, RabbitMQ and Redis are shared with whatever else runs on it",
        "postgres_autovacuum": postgres_setting("autovacuum"),
    }


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def due_instant(lead_s: float) -> float:
    """T: a whole second at least lead_s from now (Unix time)."""
    return float(int(time.time() + lead_s) + 1)


def sleep_until(instant: float) -> None:
    time.sleep(max(0.0, instant - time.time()))


def measure_burst(
    sink: NginxSink,
    jobs: int,
    due: float,
    meter: CpuMeter,
    *,
    window_lead_s: float = WINDOW_LEAD_S,
    timeout_s: float = 900,
    stall_s: float = 90,
    settle_s: float = 5,
    registered_at: float | None = None,
    say=print,
) -> dict:
    """Wait for the burst due at `due` and return its figures: arrivals, lateness,
    CPU per component over the window, load average."""
    paths = {f"/hook/{i}" for i in range(jobs)}
    window_start = due - window_lead_s
    late_registration = registered_at is not None and registered_at > window_start
    if late_registration:
        overlap_s = registered_at - window_start
        say(f"warning: registration ended {overlap_s:.1f} s into the CPU window; raise --lead-s")
    sleep_until(window_start)
    meter.start()
    window_began = time.time()
    load_at_window = loadavg()
    sleep_until(due)
    load_at_due = loadavg()
    deadline, last_count, last_change = due + timeout_s, -1, time.time()
    ended_by = "all arrived"
    while True:
        arrived = {a.path for a in sink.arrivals()} & paths
        now = time.time()
        if len(arrived) != last_count:
            last_count, last_change = len(arrived), now
        if len(arrived) >= jobs:
            break
        if now > deadline:
            ended_by = f"timeout ({timeout_s:g} s)"
            break
        if now - max(last_change, due) > stall_s:
            ended_by = f"stall (no new job for {stall_s:g} s)"
            break
        time.sleep(0.1)
    cpu_s = meter.stop()
    cpu_ms = with_own_total(per_run_ms(cpu_s, max(1, len(arrived)), not_in_total=(OWN_BACKENDS,)))
    window_ended = time.time()
    load_at_end = loadavg()
    time.sleep(settle_s)  # late duplicates, and the log's last flush
    figures = burst_figures(sink.arrivals(), jobs, due, paths)
    return {
        **figures,
        "due": datetime.fromtimestamp(due, UTC).isoformat(),
        "waiting_ended_by": ended_by,
        "registration_overlapped_cpu_window": late_registration,
        "cpu_s": cpu_s,
        "cpu_ms_per_run": cpu_ms,
        "cpu_window": {
            "from_due_s": round(window_began - due, 2),
            "to_due_s": round(window_ended - due, 2),
            "note": "from T - 15 s (or the claim-ahead window + 5 s) until the last job's first call was "
            "seen (log flushes every 250 ms, polled every 100 ms)",
        },
        "load_average": {"window_start": load_at_window, "due": load_at_due, "end": load_at_end},
    }


def write_result(result: dict, kind: str, label: str, out: str | None) -> Path:
    """bench/results/<kind>-<label>-<UTC stamp>.json, or `out`."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(out) if out else RESULTS / f"{kind}-{label}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def header(kind: str) -> dict:
    return {
        "bench": kind,
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": f"python -m bench.{kind} " + " ".join(sys.argv[1:]),
        **commit(),
        "machine": machine(),
        "load_average_before": loadavg(),
    }


def summary(result: dict) -> str:
    late, cpu = result["lateness_s"], result["cpu_ms_per_run"]
    reg = result.get("registration", {})
    return "\n".join(
        [
            f"{result['system']}: {result['jobs']:,} jobs due at one instant "
            f"(load {result['load_average']['due'][0]} at T)",
            f"registration        {reg.get('jobs_per_s', '?'):,} jobs/s ({reg.get('way', '?')}), "
            f"{reg.get('failures', '?')} failures",
            f"started             {result['started']:,}   missing {result['missing']}   duplicate calls "
            f"{result['duplicate_calls']}   retried attempts {result['retried_attempts']}",
            f"starts/s from T     {result['starts_per_s']}   "
            f"(first call T+{result['first_arrival_after_due_s']} s,"
            f" last first call T+{result['last_first_arrival_after_due_s']} s)",
            f"lateness            p50 {late['p50']} s  p90 {late['p90']} s  p99 {late['p99']} s  "
            f"max {late['max']} s",
            "cpu-ms per run      " + ", ".join(f"{k} {v}" for k, v in cpu.items()),
        ]
    )


def plot(path: Path, result: dict) -> Path:
    """A PNG of starts per second (made on demand with --plot; not committed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = result["starts_per_second"]
    fig, axis = plt.subplots(figsize=(9, 4))
    axis.plot(range(len(bins)), bins, linewidth=1.3)
    axis.set_xlabel("seconds after T")
    axis.set_ylabel("jobs started (first call at the sink)")
    axis.set_title(
        f"{result['system']}, {result['jobs']:,} jobs: {result['starts_per_s']}/s, "
        f"p99 {result['lateness_s']['p99']} s",
        fontsize=10,
    )
    axis.grid(alpha=0.3)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return png
