"""What one webhook call costs the calling process, back to back and spaced in time.

    python -m bench.spacing [--requests 400] [--gaps-ms 0,1,5,20] [--rounds 3]

One event loop and one aiohttp session, as a worker process's calls' loop, POSTs a
small JSON body to the nginx sink, --requests times per gap, after 50 calls to warm
the connection; before each call the loop sleeps the gap (0: none), as a steady
load's calls wait on their timers. Beside each gap, the same sleeps without the calls
(the timers' own cost). Figures: the thread's CPU per call (time.thread_time over the
whole sequence, so the loop's wakeups count), the median of --rounds rounds, the gaps
taken in turn within each round. The difference between the gaps is the price of
work that comes a little at a time: the same code costs more when the process has
slept between calls (docs/design.md, "Measuring"). JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from statistics import median

import aiohttp

from bench.common import machine, shown, write_result
from bench.nginx import NginxSink

WARM_CALLS = 50
BODY = b'{"job":"bench","payload":{"n":1}}'


async def _sequence(url: str, requests: int, gap_s: float, call: bool) -> float:
    """The thread's CPU seconds per step of `requests` steps: sleep `gap_s`, then (with
    `call`) one POST read to its end."""
    async with aiohttp.ClientSession() as session:

        async def post() -> None:
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as reply:
                await reply.read()

        for _ in range(WARM_CALLS):
            await post()
        began = time.thread_time()
        for _ in range(requests):
            if gap_s:
                await asyncio.sleep(gap_s)
            if call:
                await post()
        return (time.thread_time() - began) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--gaps-ms", default="0,1,5,20", help="comma-separated sleeps before each call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--install-sink", action="store_true", help="install nginx if missing (as root)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    gaps = [float(gap) for gap in args.gaps_ms.split(",")]
    calls: dict[float, list[float]] = {gap: [] for gap in gaps}
    sleeps: dict[float, list[float]] = {gap: [] for gap in gaps}
    with NginxSink(install=args.install_sink) as sink:
        url = sink.url("/hook/spacing")
        for _ in range(args.rounds):
            for gap in gaps:
                calls[gap].append(asyncio.run(_sequence(url, args.requests, gap / 1000, call=True)))
                sleeps[gap].append(asyncio.run(_sequence(url, args.requests, gap / 1000, call=False)))
    figures = {}
    for gap in gaps:
        step_us, sleep_us = median(calls[gap]) * 1e6, median(sleeps[gap]) * 1e6
        figures[f"{gap:g}"] = {
            "cpu_us_per_call": step_us,
            "cpu_us_per_sleep": sleep_us,
            "cpu_us_per_call_all": [c * 1e6 for c in calls[gap]],
        }
        print(
            f"gap {gap:5g} ms: {step_us:6.0f} us of CPU a call with its sleep "
            f"({', '.join(f'{c * 1e6:.0f}' for c in calls[gap])}); the sleep alone {sleep_us:4.0f} us"
        )
    path = write_result(
        "spacing",
        {"requests": args.requests, "rounds": args.rounds, "gaps_ms": figures, "machine": machine()},
        args.label,
    )
    print(shown(path))


if __name__ == "__main__":
    main()
