"""What Punctual costs with nothing to do: each component's CPU while no job is due.

    python -m bench.idle [--seconds 30] [--settle-s 10] [--set PUNCTUAL_X=Y]

The README's processes on a fresh database, vhost and Redis prefix (bench/stack.py),
the shipped defaults, no job registered. After --settle-s of start-up, the CPU of
each process tree (worker, beat, API), of this database's Postgres backends, and of
the shared servers (Postgres, RabbitMQ, Redis: on a busy box an upper bound) is read
from /proc over --seconds and printed as CPU-ms per second, with two totals: the
stack with its own Postgres backends (RabbitMQ and Redis whole), and with the whole
Postgres server instead. What an idle stack spends, it spends during a burst too: beat's
ticks and the polls they make are the same every second.
"""

from __future__ import annotations

import argparse
import time

from bench.cpu import OWN_BACKENDS, CpuMeter
from bench.cpu import SERVICES as SERVER_NAMES
from bench.harness import header, stop_cleanly_on_sigterm, write_result
from bench.stack import PunctualStack, backend_pids, parse_overrides

SERVICES = ("postgres", "beam.smp", "redis-server")
SERVER_POSTGRES = SERVER_NAMES["postgres"]


def measure(seconds: float, settle_s: float, overrides: dict[str, str]) -> dict:
    result = header("idle")
    with PunctualStack(overrides) as stack:
        time.sleep(settle_s)
        meter = CpuMeter(
            stack.components, services=SERVICES, dynamic={OWN_BACKENDS: backend_pids(stack.database)}
        )
        meter.start()
        time.sleep(seconds)
        cpu_s = meter.stop()
        per_s = {name: round(1000 * used / seconds, 1) for name, used in cpu_s.items()}
        result.update(
            seconds=seconds,
            cpu_ms_per_s={**per_s, **totals(per_s)},
            settings=stack.settings,
            set_by_flag=overrides,
            processes=stack.commands,
        )
    return result


def totals(per_s: dict[str, float]) -> dict[str, float]:
    """The stack's total with its own Postgres backends, and with the whole server."""
    shared = sum(v for name, v in per_s.items() if name not in (OWN_BACKENDS, SERVER_POSTGRES))
    return {
        "total (own backends)": round(shared + per_s.get(OWN_BACKENDS, 0.0), 1),
        "total (whole postgres)": round(shared + per_s.get(SERVER_POSTGRES, 0.0), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30, help="how long the CPU is read")
    parser.add_argument("--settle-s", type=float, default=10, help="start-up left out before that")
    parser.add_argument("--set", action="append", default=[], metavar="PUNCTUAL_X=Y")
    parser.add_argument("--label", default="", help="added to the result file's name")
    parser.add_argument("--out", help="write the JSON here instead of bench/results/")
    stop_cleanly_on_sigterm()
    args = parser.parse_args()
    result = measure(args.seconds, args.settle_s, parse_overrides(args.set))
    print(
        ", ".join(f"{name} {value:g}" for name, value in result["cpu_ms_per_s"].items()), "CPU-ms per second"
    )
    print(f"written to {write_result(result, 'idle', args.label or 'stack', args.out)}")


if __name__ == "__main__":
    main()
