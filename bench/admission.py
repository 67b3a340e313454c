"""The limiter's admission alone: what one `acquire_many` costs the worker that asks.

    python -m bench.admission [--runs 1,5,30,100] [--calls 300] [--repeat 3]

Against the real Redis (PUNCTUAL_BENCH_REDIS), under a key prefix of its own that it
removes afterwards, one RedisLimiter as a worker process holds it. For each batch
size, two cases a dispatch meets under a concurrency cap:

- admitted: a cap with room for every run; each batch's slots are released after it
  (outside the timing), so every batch is admitted whole;
- full: a cap of 200 held by 200 other holders; every run of the batch is refused
  ("cap", with a hint), as a dispatch's runs waiting for a slot are when it looks
  again.

Figures: the client's CPU (time.process_time: encoding the script's arguments,
reading its answers) and the wall time (that, plus the round trip and the script's
own run in Redis) per call and per run, medians of --repeat measurements of --calls
calls each. JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import secrets
import time
import uuid
from statistics import median

import redis

from app.limits.policy import LimitSpec
from app.limits.redis_limiter import RedisLimiter
from bench.common import machine, shown, write_result
from bench.stack import REDIS_URL

LEASE_S = 60.0
FULL_CAP = 200


def _requests(spec: LimitSpec, runs: int) -> list:
    """(specs, holder, reserver) as a dispatch names them: run_id.token, job_id."""
    return [([spec], f"{uuid.uuid4()}.{secrets.token_hex(4)}", str(uuid.uuid4())) for _ in range(runs)]


def _measure(limiter: RedisLimiter, spec: LimitSpec, runs: int, calls: int, admitted: bool) -> dict:
    cpu = wall = 0.0
    for _ in range(calls):
        batch = _requests(spec, runs)
        c0, w0 = time.process_time(), time.perf_counter()
        answers = limiter.acquire_many(batch, time.time(), LEASE_S)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        if not all(a.admitted == admitted for a in answers):
            raise SystemExit(f"unexpected answers for a {'free' if admitted else 'full'} cap: {answers[:3]}")
        if admitted:
            limiter.release_many([(specs, holder) for specs, holder, _ in batch])
    return {"cpu_ms_per_call": cpu / calls * 1e3, "wall_ms_per_call": wall / calls * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="1,5,30,100", help="runs per acquire_many (comma-separated)")
    parser.add_argument("--calls", type=int, default=300, help="calls per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per figure (medians)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]

    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-admission-{secrets.token_hex(4)}"
    limiter = RedisLimiter(client, prefix)
    free = LimitSpec("origin:http://127.0.0.1:8080", max_concurrency=1_000_000)
    full = LimitSpec("origin:http://127.0.0.1:8081", max_concurrency=FULL_CAP)
    rows = []
    try:
        filled = limiter.acquire_many([([full], f"filler-{i}") for i in range(FULL_CAP)], time.time(), 3600)
        assert all(a.admitted for a in filled)
        for runs in sizes:
            for case, spec in (("admitted", free), ("full", full)):
                figures = [
                    _measure(limiter, spec, runs, args.calls, case == "admitted") for _ in range(args.repeat)
                ]
                cpu = median(f["cpu_ms_per_call"] for f in figures)
                wall = median(f["wall_ms_per_call"] for f in figures)
                row = {
                    "runs": runs,
                    "case": case,
                    "cpu_ms_per_call": round(cpu, 3),
                    "cpu_us_per_run": round(cpu / runs * 1e3, 1),
                    "wall_ms_per_call": round(wall, 3),
                }
                rows.append(row)
                print(
                    f"{runs:4d} runs  {case:8s}  client CPU {cpu:6.3f} ms a call "
                    f"({row['cpu_us_per_run']:6.1f} us a run)  wall {wall:6.3f} ms a call"
                )
    finally:
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()
    path = write_result(
        "admission",
        {"calls": args.calls, "repeat": args.repeat, "figures": rows, "machine": machine()},
        args.label,
    )
    print(f"written to {shown(path)}")


if __name__ == "__main__":
    main()
