"""The claim path alone, next to the same SQL run bare.

    python -m bench.claim [--jobs 20000] [--batches 100,500,1000] [--pollers 1,2,4]

One fresh Postgres database, 16 logical shards. For each batch size and number of
pollers (processes; poller i drains shards i, i + P, ...): insert --jobs one-off
jobs that are all due, then time how long the pollers take to claim every one.

- code: app.pollers.claim.claim_batch, as a poll tick calls it (the SELECT ... FOR
  UPDATE SKIP LOCKED, the plan of each row, the batched UPDATE of jobs and INSERT
  of run rows, one transaction), and the DispatchRun list it returns;
- code-unfenced (with --fence-triggers): the same code with the shard-move fence
  triggers of migration 0004 dropped, alternated with `code`: what the triggers cost
  a claim when no shard is moving;
- bare: one statement doing the same writes (a CTE: the same SELECT, the UPDATE of
  jobs, the INSERT of run rows RETURNING what a dispatch message needs), sent
  through the driver (psycopg) with no Python around it but the loop.

rows/s = jobs / elapsed; the ratio bare/code is the cost of the code. Each figure
is the median of --repeat measurements, bare and code alternated (the box is
shared and noisy). JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import time
from datetime import UTC, datetime, timedelta
from statistics import median

from bench.common import Stack, machine, shown, write_result

BARE_CLAIM = """
WITH due AS (
    SELECT job_id FROM jobs
    WHERE shard = %(shard)s AND state = 'scheduled' AND next_run_at <= %(now)s
    ORDER BY next_run_at LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs SET state = 'running', lease_token = gen_random_uuid(), leased_until = %(until)s,
                    attempt = 0, updated_at = %(now)s
    FROM due WHERE jobs.job_id = due.job_id
    RETURNING jobs.job_id, jobs.shard, jobs.owner, jobs.nominal_at, jobs.lease_token, jobs.target,
              jobs.payload,
              jobs.retry_max_attempts, jobs.retry_backoff_s, jobs.retry_max_backoff_s
), inserted AS (
    INSERT INTO runs (run_id, job_id, shard, owner, origin, scheduled_for, attempt, state, lease_token,
                      due_at,
                      published, target, retry, created_at, updated_at)
    SELECT gen_random_uuid(), job_id, shard, owner, 'schedule', nominal_at, 1, 'claimed', lease_token,
           %(due_at)s,
           false, target, jsonb_build_object('max_attempts', retry_max_attempts, 'backoff_s', retry_backoff_s,
                                             'max_backoff_s', retry_max_backoff_s), %(now)s, %(now)s
    FROM claimed
    RETURNING run_id, job_id, lease_token, scheduled_for, target, retry
)
SELECT inserted.*, claimed.payload FROM inserted JOIN claimed USING (job_id)
"""


def _poller(args: tuple) -> int:
    mode, dsn, shards, batch, start_at = args
    from app.registry.engines import create_engine_for
    from app.settings import Settings

    settings = Settings.from_env({"PUNCTUAL_DATABASE_URLS": dsn, "PUNCTUAL_SHARDS": "16"})
    engine = create_engine_for(dsn, pool_size=1)
    with engine.connect() as warm:  # connect before the clock starts
        warm.exec_driver_sql("SELECT 1")
    claimed = 0
    time.sleep(max(0.0, start_at - time.time()))
    if mode == "code":
        from app.core.timefmt import utcnow
        from app.pollers.claim import claim_batch

        for shard in shards:
            while True:
                result = claim_batch(engine, shard, utcnow(), settings, batch)
                claimed += len(result.runs)
                if result.empty:
                    break
    else:
        raw = engine.raw_connection()
        cursor = raw.cursor()
        for shard in shards:
            while True:
                now = datetime.now(UTC)
                cursor.execute(
                    BARE_CLAIM,
                    {
                        "shard": shard,
                        "now": now,
                        "limit": batch,
                        "until": now + timedelta(seconds=60),
                        "due_at": now + timedelta(seconds=5),
                    },
                )
                rows = cursor.fetchall()
                raw.commit()
                claimed += len(rows)
                if not rows:
                    break
        raw.close()
    engine.dispose()
    return claimed


def measure(stack: Stack, mode: str, jobs: int, batch: int, pollers: int) -> dict:
    import sqlalchemy as sa

    from tests.rows import insert_jobs, job_row, webhook_target

    engine = stack.registry.engines[0]
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE runs")
        conn.exec_driver_sql("DELETE FROM jobs")
        fence = importlib.import_module("migrations.versions.0004_shard_map")
        for statement in fence.drop_fence_triggers() + (fence.fence_triggers() if mode != "code-unfenced" else []):
            conn.execute(sa.text(statement))
    due = datetime.now(UTC) - timedelta(seconds=1)
    target = webhook_target("http://127.0.0.1:9/claim")
    insert_jobs(
        stack.registry,
        [job_row(16, owner=stack.owner, run_at=due, target=target, payload={"n": i}) for i in range(jobs)],
    )
    start_at = time.time() + 1.0
    work = [("bare" if mode == "bare" else "code", stack.dsns[0], list(range(p, 16, pollers)), batch, start_at)
            for p in range(pollers)]
    with multiprocessing.get_context("fork").Pool(pollers) as pool:
        result = pool.map_async(_poller, work)
        time.sleep(max(0.0, start_at - time.time()))
        began = time.perf_counter()
        claimed = sum(result.get())
        elapsed = time.perf_counter() - began
    with engine.connect() as conn:
        runs = conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one()
    return {
        "mode": mode,
        "batch": batch,
        "pollers": pollers,
        "claimed": claimed,
        "run_rows": runs,
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": round(claimed / elapsed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="due jobs per measurement")
    parser.add_argument("--batches", default="100,500,1000")
    parser.add_argument("--pollers", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=3, help="alternated bare/code measurements; medians are reported")
    parser.add_argument("--fence-triggers", action="store_true",
                        help="also measure the code with the fence triggers dropped (code-unfenced)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    with Stack(physical=1) as stack:
        for batch in [int(b) for b in args.batches.split(",")]:
            for pollers in [int(p) for p in args.pollers.split(",")]:
                modes = ("bare", "code") + (("code-unfenced",) if args.fence_triggers else ())
                tries = {mode: [] for mode in modes}
                for _ in range(args.repeat):  # alternated, so drift in the box's load hits both
                    for mode in modes:
                        tries[mode].append(measure(stack, mode, args.jobs, batch, pollers))
                code = median(t["rows_per_s"] for t in tries["code"])
                bare = median(t["rows_per_s"] for t in tries["bare"])
                row = {"batch": batch, "pollers": pollers, "code_rows_per_s": round(code),
                       "bare_rows_per_s": round(bare), "bare_over_code": round(bare / code, 2), "tries": tries}
                unfenced = ""
                if args.fence_triggers:
                    row["code_unfenced_rows_per_s"] = round(median(t["rows_per_s"] for t in tries["code-unfenced"]))
                    unfenced = f"  code without fence triggers {row['code_unfenced_rows_per_s']:7,.0f} rows/s"
                rows.append(row)
                print(f"batch {batch:5}  pollers {pollers}  code {code:7,.0f} rows/s  bare {bare:7,.0f} rows/s  "
                      f"bare/code {bare / code:.2f}x{unfenced}   (medians of {args.repeat})", flush=True)
    result = {"jobs_per_measurement": args.jobs, "results": rows,
              "machine": {**machine(), "load_average_before": [round(x, 2) for x in load_before],
                          "load_average_after": [round(x, 2) for x in os.getloadavg()]}}
    path = write_result("claim", result)
    print(
        f"load average {result['machine']['load_average_before'][0]} -> "
        f"{result['machine']['load_average_after'][0]}"
        f"; written to {shown(path)}"
    )


if __name__ == "__main__":
    main()
