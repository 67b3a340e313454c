"""Retention under load: bench.steady's window while the sweeps prune a big run history,
beside the same window with no history to prune.

    python -m bench.prune [--history-rows 10000000] [--rounds 1] [bench.steady's options]

Each round runs two steady windows, alternated (without history, then with it), each
on a fresh stack (bench/stack.py: the README's processes, the shipped defaults
unless --set). For the window with history, --history-rows finished runs that
ended before PUNCTUAL_HISTORY_DAYS (31 days ago and earlier), spread over the 16
logical shards, are written straight into the database (INSERT ... SELECT
generate_series, 100,000 a statement, then ANALYZE) after `punctual migrate` and
before any process starts; the shards' sweeps start pruning them as soon as the
worker is up, during registration and through the window.

Printed and written to bench/results/: for each window, bench.steady's figures
(lateness p50/p99 by kind, missing, duplicate calls, CPU, load average), the rows
deleted from runs before the window and during it (and per second; read from
pg_stat_user_tables, so no scan of the big table runs at the window's edges; in the
window without history they are runs a limit held back), and the old runs still
left once the window's last occurrence called. None left (`history_gone_by_end`)
means the prune may have run dry inside the window.
"""

from __future__ import annotations

import argparse
import time

from bench.harness import header, loadavg, stop_cleanly_on_sigterm, write_result
from bench.nginx import NginxSink
from bench.stack import PunctualStack, parse_overrides
from bench.steady import add_window_arguments, print_figures, run_window

CHUNK = 100_000
HISTORY = """
INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state, published, target,
                  retry, started_at, finished_at, lateness_ms, status_code, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), n %% %(shards)s, 'bench', 'schedule', at, 1, 'succeeded', true,
       '{"type": "webhook", "url": "http://127.0.0.1:9/"}', '{}', at, at, 5, 200, at, at
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n,
     LATERAL (SELECT now() - (%(days)s + 1) * interval '1 day' - n * interval '10 ms' AS at) AS t
"""
OLD_RUNS = "SELECT count(*) FROM runs WHERE finished_at < now() - %(days)s * interval '1 day'"
# Rows deleted from runs so far, from the statistics collector: no scan of the big
# table at the window's edges (a backend reports within about 10 s, PostgreSQL 15).
RUNS_DELETED = "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'runs'"


def fill_history(dsn: str, rows: int, shards: int, days: float) -> dict:
    """`rows` succeeded runs of no job, finished more than `days` + 1 days ago."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(1, rows + 1, CHUNK):
            last = min(rows, first + CHUNK - 1)
            conn.execute(HISTORY, {"shards": shards, "first": first, "last": last, "days": days})
            if last % 1_000_000 < CHUNK:
                print(f"  history: {last:,} of {rows:,} runs written", flush=True)
        conn.execute("ANALYZE runs")
        size = conn.execute("SELECT pg_total_relation_size('runs')").fetchone()[0]
    return {"rows": rows, "fill_s": round(time.monotonic() - started, 1), "runs_table_bytes": size}


class Deletions:
    """Rows deleted from runs at the window's edges, and the old runs left afterwards."""

    def __init__(self, dsn: str, days: float, history_rows: int):
        self.dsn, self.days, self.history_rows = dsn, days, history_rows
        self.marks: dict[str, tuple[float, int]] = {}
        self.left_at_end: int | None = None

    def mark(self, label: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            deleted = conn.execute(RUNS_DELETED).fetchone()[0]
        self.marks[label] = (time.time(), deleted)

    def count_left(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.left_at_end = conn.execute(OLD_RUNS, {"days": self.days}).fetchone()[0]

    def figures(self) -> dict:
        (opened_at, at_open), (closed_at, at_close) = self.marks["open"], self.marks["close"]
        deleted = at_close - at_open
        return {
            "runs_deleted_before_window": at_open,
            "runs_deleted_in_window": deleted,
            "runs_deleted_per_s_in_window": round(deleted / max(closed_at - opened_at, 1e-9), 1),
            "old_runs_left_at_end": self.left_at_end,
            # Nothing old left after the window: the prune may have run dry inside it.
            "history_gone_by_end": bool(self.history_rows) and self.left_at_end == 0,
        }


def one_window(args, overrides: dict[str, str], history_rows: int) -> dict:
    history: dict = {"rows": 0}

    def prepare(dsn: str) -> None:
        days = float(stack.settings["PUNCTUAL_HISTORY_DAYS"])
        if history_rows:
            print(f"writing {history_rows:,} finished runs older than {days:g} days", flush=True)
            history.update(fill_history(dsn, history_rows, int(stack.settings["PUNCTUAL_SHARDS"]), days))
            print(f"  written in {history['fill_s']} s", flush=True)

    stack = PunctualStack(overrides, prepare=prepare)
    with NginxSink(install=args.install_sink) as sink, stack:
        # Marked in both windows alike; in the one without history, the runs deleted are
        # those a limit held back (no attempt spent), not pruned ones.
        deletions = Deletions(stack.database, float(stack.settings["PUNCTUAL_HISTORY_DAYS"]), history_rows)
        figures = run_window(
            stack,
            sink,
            args,
            on_open=lambda: deletions.mark("open"),
            on_close=lambda: deletions.mark("close"),
        )
        deletions.count_left()
        settings = stack.settings
        commands = stack.commands
    window = {"history": {**history, **deletions.figures()}, **figures}
    return {"window": window, "settings": settings, "processes": commands}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prune", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--history-rows", type=int, default=10_000_000, help="finished runs past the history bound"
    )
    parser.add_argument("--rounds", type=int, default=1, help="pairs of windows: without, then with history")
    add_window_arguments(parser)
    parser.add_argument("--out", help="write the JSON here instead of bench/results/")
    args = parser.parse_args()
    stop_cleanly_on_sigterm()
    result = header("prune")
    overrides = parse_overrides(args.set)
    load_before = loadavg()
    windows = []
    for round_no in range(1, args.rounds + 1):
        for history_rows in (0, args.history_rows):
            print(f"round {round_no}: {'with' if history_rows else 'without'} history", flush=True)
            ran = one_window(args, overrides, history_rows)
            windows.append({"round": round_no, "history_rows": history_rows, **ran["window"]})
            print_figures(ran["window"], args.rate, args.duration_s)
            if history_rows:
                print(f"  history: {windows[-1]['history']}", flush=True)
            settings, commands = ran["settings"], ran["processes"]
    result.update(
        system="punctual",
        rate_per_s=args.rate,
        duration_s=args.duration_s,
        history_rows=args.history_rows,
        windows=windows,
        load_average_before=load_before,
        settings=settings,
        set_by_flag=overrides,
        processes=commands,
    )
    label = f"{args.history_rows}-{int(args.rate)}-{int(args.duration_s)}s"
    path = write_result(result, "prune", label, args.out)
    print("lateness p50 / p99 (s), by window:")
    for window in windows:
        late = window["lateness_s"]
        history = window["history"]
        extra = (
            f"; runs deleted in the window {history['runs_deleted_in_window']:,} "
            f"({history['runs_deleted_per_s_in_window']:,}/s), old runs left after it "
            f"{history['old_runs_left_at_end']:,}"
        )
        print(
            f"  round {window['round']} {'with' if window['history_rows'] else 'without'} history: "
            f"{late['p50']} / {late['p99']}, load {window['load_average']['start'][0]}{extra}"
        )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
