"""The concurrency gate alone: what taking and giving back a slot costs a run.

    python -m bench.gate [--runs 20000] [--in-flight 128] [--cap 50] [--limiter local|redis]
                         [--repeat 3] [--owners 2]

One event loop, as a worker process's calls' loop: --in-flight tasks at a time, each
takes its slot through the process's `SlotGate` (app.worker.slot_wait), yields to
the loop once (a call that answers at once) and gives the slot back, or hands it
to a waiting run that its task then carries on with, as app.worker.engine does. Four cases:

- no cap: the runs do the same without a gate (the floor: the loop and the tasks);
- room: a cap no run finds full (--in-flight + 1);
- full: a cap of --cap under --in-flight runs, so most runs wait for a slot;
- owners: the same, the runs of --owners owners in turn, so the gate keeps their turns.

The limiter is the in-memory one (the gate's own cost), or Redis under a key prefix
of its own (removed afterwards). Figures: the process's CPU (every thread) per run, medians of --repeat
measurements. JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from statistics import median

from app.limits.line import ANYONE, Turn
from app.limits.local_limiter import LocalLimiter
from app.limits.policy import LimitSpec
from app.worker.slot_wait import Slot, SlotGate, cap_keys, wait_budget_s
from bench.common import REDIS_URL, machine, shown, write_result

LEASE_S = 60.0
HEARTBEAT_S = 10.0


def _limiter(kind: str, prefix: str):
    if kind == "redis":
        from app.limits.redis_limiter import RedisLimiter

        return RedisLimiter.from_url(REDIS_URL, prefix)
    return LocalLimiter()


async def _round(limiter, runs: int, in_flight: int, cap: int | None, owners: int = 1) -> tuple[float, int]:
    """(CPU seconds, runs put off) for `runs` runs, `in_flight` at a time, each a task
    of its own made once it has its slot, as app.worker.engine makes them; the runs of
    `owners` owners in turn."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    numbers = iter(range(runs))
    ended = 0
    put_off: list = []
    tasks: set[asyncio.Task] = set()
    caps = (LimitSpec(f"bench-gate:{secrets.token_hex(4)}", None, cap),) if cap else ()
    keys = cap_keys(caps)
    word = secrets.token_hex(4)
    turns = [Turn(f"owner-{i}") for i in range(owners)] if owners > 1 else [ANYONE]

    def launch() -> None:
        n = next(numbers, None)
        if n is None:
            return
        slot = gate.take(n, caps, keys, turns[n % len(turns)]) if caps else None
        if slot is not None or not caps:
            spawn(n, slot)

    handing_on = False  # while a call's slot is given: a run granted it is carried on
    carried: list[Slot] = []

    def spawn(_n: int, slot: Slot | None) -> None:
        if handing_on and not carried:
            carried.append(slot)  # type: ignore[arg-type]
            return
        task = loop.create_task(call(slot))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def call(slot: Slot | None) -> None:
        """A call's task: the call, then the run handed its slot, as the engine's _calls."""
        nonlocal handing_on
        while True:
            await asyncio.sleep(0)  # a call that answers at once
            if slot is not None:
                handing_on = True
                try:
                    if not gate.give(caps, keys, slot):
                        gate.release(caps, slot.holder)
                finally:
                    handing_on = False
            end()
            if not carried:
                return
            slot = carried.pop()

    def end(count: int = 1) -> None:
        nonlocal ended
        ended += count
        if ended == runs:
            finished.set_result(None)
        for _ in range(count):
            launch()

    def on_put_off(items: list) -> None:  # (on a thread)
        put_off.extend(items)
        loop.call_soon_threadsafe(end, len(items))

    gate = SlotGate(
        limiter,
        LEASE_S,
        HEARTBEAT_S,
        wait_budget_s(LEASE_S),
        spawn,
        on_put_off,
        lambda n: f"{n}.{word}",
    )
    c0 = time.process_time()
    for _ in range(in_flight):
        launch()
    await finished
    await gate.settled()
    cpu = time.process_time() - c0
    await asyncio.sleep(0.05)  # the gate's last round trip, when one is under way, ends
    await limiter.aclose()
    return cpu, len(put_off)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--cap", type=int, default=50)
    parser.add_argument("--limiter", choices=["local", "redis"], default="local")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--owners", type=int, default=2, help="the owners of the last case")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    prefix = f"bench-gate-{secrets.token_hex(4)}"
    limiter = _limiter(args.limiter, prefix)
    cases = {"no cap": (None, 1), "room": (args.in_flight + 1, 1), "full": (args.cap, 1)}
    cases["owners"] = (args.cap, args.owners)
    figures: dict[str, dict] = {}
    try:
        for name, (cap, owners) in cases.items():
            cpu, put_off = [], 0
            for _ in range(args.repeat):
                spent, off = asyncio.run(_round(limiter, args.runs, args.in_flight, cap, owners))
                cpu.append(spent)
                put_off += off
            figures[name] = {
                "cap": cap,
                "owners": owners,
                "cpu_us_per_run": median(cpu) / args.runs * 1e6,
                "cpu_us_per_run_all": [c / args.runs * 1e6 for c in cpu],
                "put_off": put_off,
            }
            print(
                f"{name:>7}: {figures[name]['cpu_us_per_run']:6.1f} us of CPU a run "
                f"({', '.join(f'{c:.1f}' for c in figures[name]['cpu_us_per_run_all'])}); put off: {put_off}"
            )
    finally:
        if args.limiter == "redis":
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            for key in client.scan_iter(f"{prefix}:*"):
                client.delete(key)
    path = write_result(
        "gate",
        {
            "runs": args.runs,
            "in_flight": args.in_flight,
            "limiter": args.limiter,
            "repeat": args.repeat,
            "cases": figures,
            "machine": machine(),
        },
        args.label,
    )
    print(shown(path))


if __name__ == "__main__":
    main()
