"""The claim path alone, next to the same SQL run bare.

    python -m bench.claim [--jobs 20000] [--batches 100,500,1000] [--pollers 1,2,4] [--owners 1,1000]

One fresh Postgres database, 16 logical shards. For each batch size and number of
pollers (processes; poller i drains shards i, i + P, ...): insert --jobs one-off
jobs that are all due, then time how long the pollers take to claim every one.

- code: app.pollers.claim.claim_batch, as a poll tick calls it (the SELECT ... FOR
  UPDATE SKIP LOCKED, the plan of each row, the batched UPDATE of jobs and INSERT
  of run rows, one transaction), and the DispatchRun list it returns;
- bare: one statement doing the same writes (a CTE: the same SELECT, the UPDATE of
  jobs, the INSERT of run rows RETURNING what a dispatch message needs), sent
  through the driver (psycopg) with no Python around it but the loop;
- oldest (with --owners): the code with the claim's SELECT as it was before the fair
  claim (`due_jobs` alone: oldest first, whoever the owner), to price fairness.

--owners N spreads the jobs over N owners (owner-0 ... owner-N-1, round-robin), so
the fair claim has N owners to take turns between; ms/batch is the time one poller
spends per claim transaction (elapsed / batches).

rows/s = jobs / elapsed; the ratio bare/code is the cost of the code. Each figure
is the median of --repeat measurements, bare and code alternated (the box is
shared and noisy). JSON to bench/results/.
"""

from __future__ import annotations

import argparse
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


def _oldest_first(conn, shard, horizon, limit, lock, weights):
    """The claim's SELECT before the fair claim: the oldest due rows, whoever the owner."""
    from app.pollers.claim import due_jobs

    rows = conn.execute(due_jobs(shard, horizon, limit, lock)).mappings().all()
    return rows, len(rows) >= limit


def _poller(args: tuple) -> tuple[int, int]:
    mode, dsn, shards, batch, start_at = args
    from app.registry.engines import create_engine_for
    from app.settings import Settings

    settings = Settings.from_env({"PUNCTUAL_DATABASE_URLS": dsn, "PUNCTUAL_SHARDS": "16"})
    engine = create_engine_for(dsn, pool_size=1)
    with engine.connect() as warm:  # connect before the clock starts
        warm.exec_driver_sql("SELECT 1")
    claimed = batches = 0
    time.sleep(max(0.0, start_at - time.time()))
    if mode in ("code", "oldest"):
        from app.core.timefmt import utcnow
        from app.pollers import claim

        if mode == "oldest":
            claim._select_due = _oldest_first
        for shard in shards:
            while True:
                result = claim.claim_batch(engine, shard, utcnow(), settings, batch)
                claimed += len(result.runs)
                batches += 1
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
                batches += 1
                if not rows:
                    break
        raw.close()
    engine.dispose()
    return claimed, batches


def measure(stack: Stack, mode: str, jobs: int, batch: int, pollers: int, owners: int = 1) -> dict:
    import sqlalchemy as sa

    from tests.rows import insert_jobs, job_row, webhook_target

    engine = stack.registry.engines[0]
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE runs")
        conn.exec_driver_sql("DELETE FROM jobs")
    due = datetime.now(UTC) - timedelta(seconds=1)
    target = webhook_target("http://127.0.0.1:9/claim")
    names = [stack.owner] if owners == 1 else [f"owner-{i}" for i in range(owners)]
    insert_jobs(
        stack.registry,
        [
            job_row(16, owner=names[i % owners], run_at=due, target=target, payload={"n": i})
            for i in range(jobs)
        ],
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")
    start_at = time.time() + 1.0
    work = [(mode, stack.dsns[0], list(range(p, 16, pollers)), batch, start_at) for p in range(pollers)]
    with multiprocessing.get_context("fork").Pool(pollers) as pool:
        result = pool.map_async(_poller, work)
        time.sleep(max(0.0, start_at - time.time()))
        began = time.perf_counter()
        counts = result.get()
        elapsed = time.perf_counter() - began
    claimed, batches = sum(c for c, _ in counts), sum(b for _, b in counts)
    with engine.connect() as conn:
        runs = conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one()
    return {
        "mode": mode,
        "batch": batch,
        "pollers": pollers,
        "owners": owners,
        "claimed": claimed,
        "run_rows": runs,
        "batches": batches,
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": round(claimed / elapsed),
        "ms_per_batch": round(elapsed * 1000 * pollers / batches, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10000, help="due jobs per measurement")
    parser.add_argument("--batches", default="100,500,1000")
    parser.add_argument("--pollers", default="1,2,4")
    parser.add_argument(
        "--owners",
        default="1",
        help="owners the jobs are spread over (comma-separated: one "
        "measurement each); with more than one, the oldest-first claim is measured beside the fair one",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="alternated bare/code measurements; medians are reported"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    with Stack(physical=1) as stack:
        for owners in [int(o) for o in args.owners.split(",")]:
            for batch in [int(b) for b in args.batches.split(",")]:
                for pollers in [int(p) for p in args.pollers.split(",")]:
                    modes = (
                        ("bare", "oldest", "code")
                        if owners > 1 or len(args.owners.split(",")) > 1
                        else ("bare", "code")
                    )
                    tries: dict[str, list] = {mode: [] for mode in modes}
                    for _ in range(args.repeat):  # alternated, so drift in the box's load hits every mode
                        for mode in modes:
                            tries[mode].append(measure(stack, mode, args.jobs, batch, pollers, owners))
                    rate = {mode: median(t["rows_per_s"] for t in tries[mode]) for mode in modes}
                    ms = {mode: median(t["ms_per_batch"] for t in tries[mode]) for mode in modes}
                    row = {
                        "owners": owners,
                        "batch": batch,
                        "pollers": pollers,
                        "code_rows_per_s": round(rate["code"]),
                        "bare_rows_per_s": round(rate["bare"]),
                        "bare_over_code": round(rate["bare"] / rate["code"], 2),
                        "ms_per_batch": ms,
                        "tries": tries,
                    }
                    line = (
                        f"owners {owners:5}  batch {batch:5}  pollers {pollers}  "
                        f"code {rate['code']:7,.0f} rows/s "
                        f"({ms['code']:.1f} ms/batch)  bare {rate['bare']:7,.0f} rows/s  "
                        f"bare/code {rate['bare'] / rate['code']:.2f}x"
                    )
                    if "oldest" in modes:
                        row["oldest_rows_per_s"] = round(rate["oldest"])
                        line += f"  oldest-first {rate['oldest']:7,.0f} rows/s ({ms['oldest']:.1f} ms/batch)"
                    rows.append(row)
                    print(line + f"   (medians of {args.repeat})", flush=True)
    result = {
        "jobs_per_measurement": args.jobs,
        "results": rows,
        "machine": {
            **machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    path = write_result("claim", result)
    print(
        f"load average {result['machine']['load_average_before'][0]} -> "
        f"{result['machine']['load_average_after'][0]}"
        f"; written to {shown(path)}"
    )


if __name__ == "__main__":
    main()
