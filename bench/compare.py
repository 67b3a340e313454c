"""Punctual beside its peers, alternated: the same burst, the same sink, the same box.

    python -m bench.compare --jobs 20000 --rounds 2 [--peers pgqueuer,celery,punctual-cron]
                            [--set PUNCTUAL_X=Y] [--lead-s S]

Each round runs `python -m bench.burst`, then `python -m bench.peers <peer>` for
each peer, one after the other (A/B/C, A/B/C, ...), each in its own process with
its own fresh database or vhost, so that a slow stretch of the shared box hits
all of them alike. Prints the medians and the ratio Punctual/peer, and writes one
JSON holding every run's full result.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from bench.harness import header, stop_cleanly_on_sigterm, write_result

FIGURES = (  # (label, how to read it from a result, higher is better)
    ("starts/s", lambda r: r["starts_per_s"], True),
    ("p50 s", lambda r: r["lateness_s"]["p50"], False),
    ("p99 s", lambda r: r["lateness_s"]["p99"], False),
    ("max s", lambda r: r["lateness_s"]["max"], False),
    ("missing", lambda r: r["missing"], False),
    ("dup calls", lambda r: r["duplicate_calls"], False),
    ("CPU-ms/run", lambda r: r["cpu_ms_per_run"]["total"], False),
    ("register/s", lambda r: r["registration"]["jobs_per_s"], True),
)


def command(system: str, args: argparse.Namespace, out: Path) -> list[str]:
    common = ["--jobs", str(args.jobs), "--out", str(out)]
    if args.lead_s:
        common += ["--lead-s", str(args.lead_s)]
    if system in ("punctual", "punctual-cron"):
        cron = ["--cron"] if system == "punctual-cron" else []
        return [sys.executable, "-m", "bench.burst", *common, *cron, *(f"--set={pair}" for pair in args.set)]
    return [sys.executable, "-m", "bench.peers", system, *common]


def medians(runs: list[dict]) -> dict[str, float | None]:
    found = {}
    for label, read, _higher in FIGURES:
        values = [read(r) for r in runs if read(r) is not None]
        found[label] = round(median(values), 3) if values else None
    return found


def component_medians(runs: list[dict]) -> dict[str, float]:
    """Each component's CPU-ms per run, the median over the runs that measured it: where
    a system's CPU goes, beside where its peer's goes (the totals are FIGURES')."""
    found: dict[str, list[float]] = {}
    for run in runs:
        for component, value in run["cpu_ms_per_run"].items():
            if not component.startswith("total") and value is not None:
                found.setdefault(component, []).append(value)
    return {component: round(median(values), 3) for component, values in found.items()}


def component_lines(by_system: dict[str, list[dict]]) -> list[str]:
    return [
        f"{system}: "
        + ", ".join(f"{component} {value}" for component, value in component_medians(runs).items())
        for system, runs in by_system.items()
    ]


def table(by_system: dict[str, list[dict]]) -> str:
    systems = list(by_system)
    rows = {system: medians(runs) for system, runs in by_system.items()}
    width = max(len(s) for s in systems) + 2
    lines = [" " * width + "".join(f"{label:>12}" for label, _r, _h in FIGURES) + "   runs"]
    for system in systems:
        cells = "".join(
            f"{'-' if rows[system][label] is None else format(rows[system][label], ','):>12}"
            for label, _r, _h in FIGURES
        )
        lines.append(f"{system:<{width}}{cells}   {len(by_system[system])}")
    for peer in systems[1:]:
        cells = ""
        for label, _r, _h in FIGURES:
            mine, theirs = rows["punctual"][label], rows[peer][label]
            cells += f"{format(mine / theirs, '.2f') if mine is not None and theirs else '-':>12}"
        lines.append(f"{'P/' + peer:<{width}}{cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--peers",
        default="pgqueuer,celery",
        help="comma-separated: pgqueuer, celery, punctual-cron (the burst as daily cron occurrences)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PUNCTUAL_X=Y",
        help="a Punctual setting for its runs (repeatable); the peers are not affected",
    )
    parser.add_argument(
        "--lead-s",
        type=float,
        help="T = now + this, for every system (each bench's own default otherwise; "
        "a registration that overlaps the CPU window is flagged in its result)",
    )
    parser.add_argument("--label", default="")
    parser.add_argument("--out", help="write the JSON here instead of bench/results/")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    systems = ["punctual", *[p for p in args.peers.split(",") if p]]
    result = header("compare")
    by_system: dict[str, list[dict]] = {s: [] for s in systems}
    failures = []
    scratch = Path(tempfile.mkdtemp(prefix="punctual-bench-compare-"))
    for round_no in range(1, args.rounds + 1):
        for system in systems:
            out = scratch / f"{system}-{round_no}.json"
            print(f"--- round {round_no}/{args.rounds}: {system}", flush=True)
            child = subprocess.Popen(command(system, args, out))
            try:
                code = child.wait()
            except KeyboardInterrupt:  # let the run clean up (stop its processes, drop its database)
                child.send_signal(signal.SIGINT)
                child.wait()
                raise
            if code != 0 or not out.exists():
                failures.append({"round": round_no, "system": system, "exit": code})
                continue
            by_system[system].append(json.loads(out.read_text()))
    text = table(by_system)
    result.update(
        jobs=args.jobs,
        rounds=args.rounds,
        order=systems,
        set_by_flag=args.set,
        failed_runs=failures,
        medians={s: medians(runs) for s, runs in by_system.items()},
        component_medians={s: component_medians(runs) for s, runs in by_system.items()},
        table=text.splitlines(),
        runs=by_system,
    )
    path = write_result(result, "compare", f"{args.jobs}{'-' + args.label if args.label else ''}", args.out)
    print(
        f"\n{args.jobs:,} jobs due at one instant, medians of {args.rounds} alternated rounds "
        f"(P/peer: Punctual's figure over the peer's)"
    )
    print(text)
    print("CPU-ms per run by component, medians:")
    for line in component_lines(by_system):
        print(f"  {line}")
    if failures:
        print(f"failed runs: {failures}")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
