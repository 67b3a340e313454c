"""Fair between owners, end to end (docs/api.md "Owners: fairness and weights").

Real workers and beat. In most tests here the claim is slower than the workers (one
shard, batches of 10, one batch per 0.25 s tick, nothing claimed ahead), so a backlog
stays in the registry, where the claim is fair: they pin the claim's fairness as the
workers see it. One test keeps the shipped claim (batches of 500, claimed 10 s ahead),
so that the whole burst is published before its instant and waits in the worker: it
pins the worker's turns (app.tasks.turnstile: the recurring lane first, then the owner
served least). Another has two owners call one host through its target cap, across
two workers: it pins the cap's turns (app.limits.line, app.worker.slot_wait).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.core.timefmt import utcnow
from app.registry.engines import registry_for
from app.services.owners import create_key, set_weight
from tests.e2e.conftest import make_env
from tests.e2e.processes import start_beat, start_worker, wait_ready
from tests.rows import insert_jobs, job_row, webhook_target

pytestmark = pytest.mark.e2e

BACKLOG = 1000  # owner A's jobs due at one instant: ~25 s of claiming at 40 rows/s
LATE_JOBS = 10  # owner B's, due 3 s into A's backlog


class CountingSink:
    """An HTTP target that answers /<owner>/<n> after `delay_s`, recording when each call
    arrived and how many calls of each owner were in flight at once (the most seen)."""

    def __init__(self, delay_s: float):
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.order: list[str] = []  # the owner of each call, in arrival order
        self.peak: Counter = Counter()
        self._in_flight: Counter = Counter()
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner = self.path.split("/")[1]
                with sink._lock:
                    sink.arrivals[owner].append(time.time())
                    sink.order.append(owner)
                    sink._in_flight[owner] += 1
                    sink.peak[owner] = max(sink.peak[owner], sink._in_flight[owner])
                time.sleep(delay_s)
                with sink._lock:
                    sink._in_flight[owner] -= 1
                self.send_response_only(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 1024

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def url(self, owner: str, n: int) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{owner}/{n}"

    def wait_for(self, owner: str, count: int, timeout_s: float) -> list[float]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                got = list(self.arrivals[owner])
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(got)} of {count} calls of {owner} in {timeout_s} s")
            time.sleep(0.05)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def pg_shards() -> int:
    """One logical shard (_env): the claim's fairness is measured on one poller."""
    return 1


def _env(pg_dsns, amqp_url, prefix, **overrides):
    slow_claim = dict(
        PUNCTUAL_SHARDS="1",
        PUNCTUAL_CLAIM_AHEAD_S="0",
        PUNCTUAL_CLAIM_BATCH="10",
        PUNCTUAL_POLL_BUDGET_S="0",
        PUNCTUAL_LEASE_S="30",
        PUNCTUAL_HEARTBEAT_S="5",
    )
    return make_env(pg_dsns[:1], amqp_url, prefix, **{**slow_claim, **overrides})


@pytest.fixture
def counting_sink():
    sink = CountingSink(delay_s=0.1)
    yield sink
    sink.close()


@pytest.fixture(autouse=True)
def clean(truncate):
    truncate()


def _run(env, logs, body):
    worker = start_worker(env, logs, name="fair-worker")
    beat = start_beat(env, logs, name="fair-beat")
    try:
        wait_ready(worker, 2.0)
        wait_ready(beat, 0.5)
        body()
    except BaseException:
        print(worker.tail(), beat.tail())
        raise
    finally:
        beat.stop()
        worker.stop()


def test_a_late_owners_jobs_start_on_time_while_another_owners_backlog_drains(
    pg_dsns, amqp_url, module_redis_prefix, logs, counting_sink
):
    env = _env(pg_dsns, amqp_url, module_redis_prefix + ":late")
    registry = registry_for(_settings(env))
    for owner in ("a", "b"):
        create_key(registry, owner)
    at = utcnow() + timedelta(seconds=4)
    late_at = at + timedelta(seconds=3)
    insert_jobs(
        registry,
        [
            job_row(1, owner="a", run_at=at, target=webhook_target(counting_sink.url("a", i)))
            for i in range(BACKLOG)
        ],
    )
    insert_jobs(
        registry,
        [
            job_row(1, owner="b", run_at=late_at, target=webhook_target(counting_sink.url("b", i)))
            for i in range(LATE_JOBS)
        ],
    )

    def body():
        arrived = counting_sink.wait_for("b", LATE_JOBS, timeout_s=60)
        a_by_then = len(counting_sink.arrivals["a"])
        lateness = sorted(t - late_at.timestamp() for t in arrived)
        assert a_by_then < BACKLOG - 500, (
            f"A's backlog was no longer draining ({a_by_then} of {BACKLOG} called)"
        )
        assert lateness[-1] <= 2.0, (
            f"B's calls came {[round(x, 2) for x in lateness]} s after their instant "
            f"({a_by_then} of A's before); {_claimed_and_started(registry, 'b', late_at)}"
        )

    _run(env, logs, body)


SHIPPED_CLAIM_BURST = 4000  # owner A's one-offs, all published before their instant


def test_runs_waiting_in_the_worker_take_turns_by_lane_and_by_owner(
    pg_dsns, amqp_url, module_redis_prefix, logs
):
    """A's whole burst is in the worker at its instant (claimed ahead); B's jobs due 3 s
    into it and A's own job every 2 s still start on time."""
    sink = CountingSink(delay_s=0.2)  # 2 x 64 call threads: ~640 calls/s at most, so A drains for 6 s+
    env = make_env(
        pg_dsns[:1], amqp_url, module_redis_prefix + ":turns", PUNCTUAL_SHARDS="1", PUNCTUAL_LEASE_S="30"
    )
    registry = registry_for(_settings(env))
    for owner in ("a", "b"):
        create_key(registry, owner)
    # B calls another host name of the sink: not A's per-target cap, only the turns.
    late_url = sink.url("b", 0).replace("127.0.0.1", "localhost")
    times = {}

    def insert() -> None:
        """Once the processes are up: their start-up must not make everyone late."""
        at = times["at"] = utcnow() + timedelta(seconds=6)
        times["late_at"] = at + timedelta(seconds=3)
        insert_jobs(
            registry,
            [
                *(
                    job_row(1, owner="a", run_at=at, target=webhook_target(sink.url("a", i)))
                    for i in range(SHIPPED_CLAIM_BURST)
                ),
                *(
                    job_row(
                        1, owner="b", run_at=times["late_at"], target=webhook_target(late_url[:-1] + str(i))
                    )
                    for i in range(LATE_JOBS)
                ),
                # A's own recurring job (the lane, not fairness, keeps it on time).
                job_row(
                    1,
                    owner="a",
                    interval_s=2,
                    first=at - timedelta(seconds=4),
                    target=webhook_target(sink.url("tick", 0)),
                ),
            ],
        )

    def body():
        insert()
        at, late_at = times["at"], times["late_at"]
        arrived = sink.wait_for("b", LATE_JOBS, timeout_s=60)
        a_by_then = len(sink.arrivals["a"])
        lateness = sorted(t - late_at.timestamp() for t in arrived)
        sink.wait_for("a", SHIPPED_CLAIM_BURST, timeout_s=120)
        drained = max(sink.arrivals["a"])
        ticks = [t for t in sink.arrivals["tick"] if at.timestamp() - 1 <= t <= drained]
        gaps = [round(b - a, 2) for a, b in zip(ticks, ticks[1:], strict=False)]
        assert a_by_then < SHIPPED_CLAIM_BURST - 500, (
            f"A's backlog was no longer draining ({a_by_then} of {SHIPPED_CLAIM_BURST} called)"
        )
        assert lateness[-1] <= 2.0, (
            f"B's calls came {[round(x, 2) for x in lateness]} s after their instant "
            f"({a_by_then} of A's before); {_claimed_and_started(registry, 'b', late_at)}"
        )
        assert len(ticks) >= 3 and max(gaps) < 3.0, (
            f"the 2 s job's gaps while A drained: {gaps}; {_tick_runs(registry, at)}"
        )

    try:
        _run(env, logs, body)
    finally:
        sink.close()


SHARED_HOST_BURST = 3000  # owner A's one-offs, through a cap of 8 calls of 20 ms: several seconds


def test_an_owner_sharing_a_capped_host_with_another_owners_burst_is_called_on_time(
    pg_dsns, amqp_url, module_redis_prefix, logs
):
    """B's jobs call the host A's burst is draining through (one target cap, across
    owners and across two workers): they take their turns in the cap's line instead of
    waiting behind A's runs, in whichever process they wait."""
    sink = CountingSink(delay_s=0.02)
    env = make_env(
        pg_dsns[:1],
        amqp_url,
        module_redis_prefix + ":shared-host",
        PUNCTUAL_SHARDS="1",
        PUNCTUAL_LEASE_S="30",
        PUNCTUAL_HEARTBEAT_S="5",
        PUNCTUAL_TARGET_MAX_CONCURRENCY="8",
        PUNCTUAL_DISPATCH_THREADS="128",  # the shipped default: deep lines
    )
    registry = registry_for(_settings(env))
    for owner in ("a", "b"):
        create_key(registry, owner)
    times = {}

    def insert() -> None:
        at = times["at"] = utcnow() + timedelta(seconds=4)
        times["late_at"] = at + timedelta(seconds=3)
        insert_jobs(
            registry,
            [
                *(
                    job_row(1, owner="a", run_at=at, target=webhook_target(sink.url("a", i)))
                    for i in range(SHARED_HOST_BURST)
                ),
                *(
                    job_row(1, owner="b", run_at=times["late_at"], target=webhook_target(sink.url("b", i)))
                    for i in range(LATE_JOBS)
                ),
            ],
        )

    workers = [start_worker(env, logs, name=f"shared-{n}") for n in range(2)]
    beat = start_beat(env, logs, name="shared-beat")
    try:
        for worker in workers:
            wait_ready(worker, 2.0)
        wait_ready(beat, 0.5)
        insert()
        late_at = times["late_at"]
        arrived = sink.wait_for("b", LATE_JOBS, timeout_s=60)
        a_by_then = len(sink.arrivals["a"])
        lateness = sorted(t - late_at.timestamp() for t in arrived)
        # Both facts in either failure's message: B's last call late by seconds also
        # finds most of A's burst called before it, which is not A's draining stopping.
        seen = (
            f"B's calls came {[round(x, 2) for x in lateness]} s after their instant, "
            f"{a_by_then} of A's {SHARED_HOST_BURST} called by then; "
            f"{_claimed_and_started(registry, 'b', late_at)}"
        )
        assert max(sink.peak.values()) <= 8, sink.peak  # the cap binds
        assert lateness[-1] <= 2.0, seen
        assert a_by_then < SHARED_HOST_BURST - 1000, f"A's backlog was no longer draining: {seen}"
    except BaseException:
        print(*(worker.tail() for worker in workers), beat.tail())
        raise
    finally:
        beat.stop()
        for worker in workers:  # what is left of A's burst is of no account here
            worker.kill()
        sink.close()


def test_weights_share_the_service_in_proportion_while_both_have_a_backlog(
    pg_dsns, amqp_url, module_redis_prefix, logs, counting_sink
):
    env = _env(pg_dsns, amqp_url, module_redis_prefix + ":weights")
    registry = registry_for(_settings(env))
    for owner in ("heavy", "light"):
        create_key(registry, owner)
    set_weight(registry, "heavy", 3)
    at = utcnow() + timedelta(seconds=4)
    insert_jobs(
        registry,
        [
            job_row(1, owner=owner, run_at=at, target=webhook_target(counting_sink.url(owner, i)))
            for owner in ("heavy", "light")
            for i in range(1200)
        ],
    )

    def body():
        counting_sink.wait_for("heavy", 600, timeout_s=60)
        first = Counter(counting_sink.order[:800])
        # Batches of 10 alternate 8 + 2 and 7 + 3: three of heavy's for one of light's.
        assert 2.5 <= first["heavy"] / first["light"] <= 3.5, first

    _run(env, logs, body)


def test_the_owner_quota_holds_calls_in_flight_across_workers(pg_dsns, amqp_url, module_redis_prefix, logs):
    sink = CountingSink(delay_s=0.3)
    env = _env(
        pg_dsns,
        amqp_url,
        module_redis_prefix + ":quota",
        PUNCTUAL_OWNER_MAX_IN_FLIGHT="4",
        PUNCTUAL_CLAIM_BATCH="500",
    )
    registry = registry_for(_settings(env))
    for owner in ("a", "b"):
        create_key(registry, owner)
    at = utcnow() + timedelta(seconds=3)
    insert_jobs(
        registry,
        [
            job_row(1, owner=owner, run_at=at, target=webhook_target(sink.url(owner, i)))
            for owner in ("a", "b")
            for i in range(40)
        ],
    )

    def body():
        sink.wait_for("a", 40, timeout_s=90)
        sink.wait_for("b", 40, timeout_s=30)
        assert sink.peak == {"a": 4, "b": 4}, sink.peak

    try:
        _run(env, logs, body)
    finally:
        sink.close()


def _claimed_and_started(registry, owner: str, due) -> str:
    """When the owner's run rows were written and its runs started, in seconds after
    `due` (for a failure's message). A run's row is written by its start in a worker
    (app.lifecycle.lease.start), not by the claim: a late row is a late dispatch."""
    import sqlalchemy as sa

    from app.registry.schema import runs

    with registry.engines[0].connect() as conn:
        rows = conn.execute(
            sa.select(runs.c.created_at, runs.c.started_at).where(runs.c.owner == owner)
        ).all()
    claimed = sorted(round((row.created_at - due).total_seconds(), 2) for row in rows)
    started = sorted(round((row.started_at - due).total_seconds(), 2) for row in rows if row.started_at)
    return f"rows written (dispatched) at {claimed}, started at {started}"


def _tick_runs(registry, since) -> str:
    """The recurring job's runs: (scheduled, claimed, started, finished, state) in s after `since`."""
    import sqlalchemy as sa

    from app.registry.schema import runs

    with registry.engines[0].connect() as conn:
        rows = conn.execute(
            sa.select(
                runs.c.scheduled_for,
                runs.c.created_at,
                runs.c.started_at,
                runs.c.finished_at,
                runs.c.state,
                runs.c.error,
            )
            .where(runs.c.target["url"].as_string().like("%/tick/%"))
            .order_by(runs.c.scheduled_for)
        ).all()

    def after(instant) -> float | None:
        return None if instant is None else round((instant - since).total_seconds(), 2)

    return "tick runs: " + ", ".join(
        str((*map(after, (r.scheduled_for, r.created_at, r.started_at, r.finished_at)), r.state, r.error))
        for r in rows
    )


def _settings(env):
    from app.settings import Settings

    return Settings.from_env(env)
