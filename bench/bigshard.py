"""One logical shard holding many jobs, most far in the future: claim latency and
`GET /jobs` page latency, beside the same with few jobs.

    python -m bench.bigshard [--sizes 10000,10000000] [--samples 30]

One fresh database, 16 logical shards, `punctual api` (the defaults). For each size,
shard 0 is filled with that many one-off jobs of one owner due in 30 days (written
with one INSERT ... SELECT per 100,000, then ANALYZE); then, --samples times:

- claim: 500 jobs due now are added to shard 0 and one claim_batch (the poll
  tick's claim, batch 500) is timed;
- list: `GET /jobs?limit=100` (the first page, newest first) and the page 10 pages
  deep (following next_cursor) are timed through the API.

p50 / p99 / max per size are printed and written to bench/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import time
from datetime import timedelta
from urllib.parse import urlsplit

from bench.common import Stack, machine, shown, write_result
from bench.figures import percentile

FILL = """
INSERT INTO jobs (job_id, shard, owner, name, target, payload, schedule_kind, run_at, timezone,
                  retry_max_attempts, retry_backoff_s, retry_max_backoff_s, misfire, dst_gap, dst_overlap,
                  jitter_s, state, next_run_at, nominal_at, attempt, misfire_exempt, created_at, updated_at)
SELECT gen_random_uuid(), 0, %(owner)s, 'far-' || n,
       '{"type": "webhook", "url": "http://127.0.0.1:9/", "method": "POST", "headers": {}, "timeout_s": 30}',
       jsonb_build_object('n', n), 'once', now() + interval '30 days', 'UTC', 5, 10, 3600, 'run_once',
       'shift', 'once', 0, 'scheduled', now() + interval '30 days' + n * interval '1 ms',
       now() + interval '30 days' + n * interval '1 ms', 0, false,
       now() - n * interval '1 ms', now()
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""


def fill(dsn: str, owner: str, already: int, total: int) -> float:
    import psycopg

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(already + 1, total + 1, 100_000):
            conn.execute(FILL, {"owner": owner, "first": first, "last": min(total, first + 99_999)})
        conn.execute("ANALYZE jobs")
    return time.monotonic() - started


def get(url: str, path: str, key: str) -> tuple[float, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
    response = conn.getresponse()
    body = json.loads(response.read())
    elapsed = time.perf_counter() - started
    conn.close()
    if response.status != 200:
        raise SystemExit(f"bench.bigshard: GET {path} answered {response.status}: {body}")
    return elapsed, body


def summary(values: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,10000000", help="jobs on the shard, ascending")
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()

    from app.core.timefmt import utcnow
    from app.pollers.claim import claim_batch
    from app.settings import Settings
    from tests.rows import insert_jobs, job_row

    load_before = os.getloadavg()
    results = []
    with Stack(physical=1) as stack:
        url = stack.start_api()
        settings = Settings.from_env(stack.env)
        engine = stack.registry.engines[0]
        have = 0
        for size in sorted(int(s) for s in args.sizes.split(",")):
            fill_s = fill(stack.dsns[0], stack.owner, have, size)
            have = size
            claims, firsts, deeps = [], [], []
            for _ in range(args.samples):
                now = utcnow()
                due = now - timedelta(seconds=1)
                rows = [job_row(16, shard=0, owner="bench-due", run_at=due) for _ in range(500)]
                insert_jobs(stack.registry, rows)
                started = time.perf_counter()
                result = claim_batch(engine, 0, utcnow(), settings)
                claims.append(time.perf_counter() - started)
                assert len(result.runs) == 500, len(result.runs)
                elapsed, page = get(url, "/jobs?limit=100", stack.api_key)
                firsts.append(elapsed)
                cursor = page["next_cursor"]
                for _ in range(9):
                    _, page = get(url, f"/jobs?limit=100&cursor={cursor}", stack.api_key)
                    cursor = page["next_cursor"]
                elapsed, _ = get(url, f"/jobs?limit=100&cursor={cursor}", stack.api_key)
                deeps.append(elapsed)
            row = {
                "jobs_on_shard": size,
                "fill_s": round(fill_s, 1),
                "claim_batch_500": summary(claims),
                "get_jobs_first_page": summary(firsts),
                "get_jobs_page_11": summary(deeps),
            }
            results.append(row)
            claim, first, deep = row["claim_batch_500"], row["get_jobs_first_page"], row["get_jobs_page_11"]
            print(
                f"{size:>11,} jobs: claim of 500 p50 {claim['p50_ms']} ms p99 {claim['p99_ms']} ms; "
                f"GET /jobs p50 {first['p50_ms']} ms p99 {first['p99_ms']} ms; "
                f"page 11 p50 {deep['p50_ms']} ms",
                flush=True,
            )
    result = {
        "samples": args.samples,
        "results": results,
        "settings": {k: str(v) for k, v in dataclasses.asdict(settings).items() if k != "database_urls"},
        "machine": {
            **machine(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    print(f"-> {shown(write_result('bigshard', result))}")


if __name__ == "__main__":
    main()
