"""One fault run on real processes: a burst of one-off jobs and a few recurring jobs,
one fault injected while it drains, and the verdict (tests/faults/verdict.py).

`FaultStack` runs Punctual as an operator would: `celery -A app worker` processes,
`celery -A app beat`, and (when asked) `punctual api`, on the databases, vhost and
Redis prefix it is given, with the shipped defaults for everything the guarantee
depends on (lease, heartbeat, claim-ahead, poll interval) unless `env` overrides
them. The target is tests.sink.Sink, which records every call's Idempotency-Key and
Punctual-Attempt.

`run(load, fault)`:
1. jobs are written straight into the registry, as the API writes them (or, with
   `load.via_api`, created through the API process while the fault happens): one-offs
   due from T over `load.spread_s`, and recurring jobs every `load.every_s` from T;
2. at T + fault.at_s the fault is injected, and healed `fault.hold_s` later (healing
   waits until the service answers again); its end is when it was healed;
3. the run waits until every one-off was called and is `completed` (bounded by
   `load.timeout_s` after the fault's end), then judges.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from tests.e2e.processes import CELERY, Proc, start_beat, start_worker, wait_ready
from tests.faults.injectors import wait_until
from tests.faults.verdict import RunRow, Verdict, calls_from_headers, judge
from tests.sink import Answer, Sink

# The guarantee's recovery goals (issue 12): after a fault ends, every run that was
# never called is called within GOAL_S, within GOAL_DB_S for the database faults.
GOAL_S = 20.0
GOAL_DB_S = 10.0
_SERVICE_URLS = ("PUNCTUAL_DATABASE_URLS", "PUNCTUAL_BROKER_URL", "PUNCTUAL_REDIS_URL")
# A dead (or stopped) worker's runs whose call may have gone out wait for their
# lease: with the shipped PUNCTUAL_LEASE_S and the janitor's sweep, less than this.
DEAD_WORKER_WAIT_S = 30.0
# What a test allows on this shared 2-core box: the goal plus a margin for a slow
# moment of the machine (meaningful: waiting for a whole default lease would fail it).
SLACK_S = 5.0


@dataclass
class Load:
    one_offs: int = 200
    spread_s: float = 5.0  # one-offs due evenly over [T, T + spread_s]; 0: all at T
    recurring: int = 3
    every_s: int = 2
    lead_s: float = 6.0  # T is this far after the load is written
    call_delay_s: float = 0.2  # how long the sink takes to answer: calls are in flight
    timeout_s: float = 120.0  # how long after the fault's end the run waits for the calls
    via_api: bool = False  # create the one-offs through `punctual api` (with Idempotency-Key)


@dataclass
class Outcome:
    fault: str
    t0: float
    fault_start: float | None
    fault_end: float | None
    verdict: Verdict
    figures: dict = field(default_factory=dict)

    def row(self) -> dict:
        rel = lambda at: None if at is None else round(at - self.t0, 1)  # noqa: E731
        return {
            "fault": self.fault,
            "fault_from_s": rel(self.fault_start),
            "fault_to_s": rel(self.fault_end),
            **self.verdict.row(),
            **self.figures,
        }

    @property
    def settled_after_fault_s(self) -> float:
        """From the fault's start to the last one-off's outcome written (0 without a fault)."""
        if self.fault_start is None or self.verdict.last_settled_s is None:
            return 0.0
        return max(0.0, self.t0 + self.verdict.last_settled_s - self.fault_start)


def _epoch(at: datetime) -> float:
    return at.timestamp()


class FaultStack:
    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        pg_admin,
        workers: int = 2,
        concurrency: int = 2,
        with_api: bool = False,
        partitioned: bool = False,
    ):
        """`partitioned`: worker 0 runs in its own network namespace (tests/faults/netns.py)."""
        from app.registry.engines import registry_for
        from app.settings import Settings

        self.env = dict(env)
        self.log_dir = log_dir
        self.pg_admin = pg_admin
        self.settings = Settings.from_env(self.env)
        self.registry = registry_for(self.settings)
        self.concurrency = concurrency
        self.worker_count = workers
        self.with_api = with_api
        self.workers: list[Proc] = []
        self.beats: list[Proc] = []
        self.api: Proc | None = None
        self.api_url = ""
        self.retired: list[Proc] = []
        self.sink = Sink()
        self.one_off_ids: list[str] = []
        self.partitioned = partitioned
        self.partition = None
        self.target_host = "127.0.0.1"
        self.owner = f"faults-{uuid.uuid4().hex[:6]}"
        self._generation = 0

    # -- processes ----------------------------------------------------------------------

    def __enter__(self) -> FaultStack:
        from app.services.owners import create_key

        key = create_key(self.registry, self.owner)
        self.api_key = key.api_key
        if self.partitioned:
            from tests.faults.netns import Partition

            sink_port = int(self.sink.base_url.rsplit(":", 1)[1])
            self.partition = Partition([5432, 5672, 6379, sink_port]).__enter__()
            self.target_host = self.partition.host_ip  # both workers reach the sink there
        self.workers = [self._worker(i) for i in range(self.worker_count)]
        self.beats = [start_beat(self.env, self.log_dir)]
        if self.with_api:
            self.api = self._start_api()
        for proc in self.processes():
            wait_ready(proc, 0.5)
        if self.api is not None:
            self._wait_api()
        time.sleep(2.0)  # the workers' children are up and consuming
        return self

    def __exit__(self, *_exc) -> None:
        for proc in self.processes() + self.retired:
            try:
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped worker cannot take SIGTERM
            except (ProcessLookupError, PermissionError):
                pass
            proc.stop(0)  # the verdict is in: no need for a warm shutdown
        if self.partition is not None:
            self.partition.__exit__(None, None, None)
        self.sink.close()

    @property
    def beat(self) -> Proc:
        return self.beats[0]

    def processes(self) -> list[Proc]:
        return [*self.workers, *self.beats, *([self.api] if self.api else [])]

    def _worker(self, index: int) -> Proc:
        self._generation += 1
        name = f"worker{index}-{self._generation}"
        if index == 0 and self.partition is not None:
            return self._worker_in_namespace(name)
        return start_worker(self.env, self.log_dir, name=name, concurrency=self.concurrency)

    def _worker_in_namespace(self, name: str) -> Proc:
        """`celery worker` as start_worker runs it, inside the namespace, reaching every
        service through the host end of the veth pair."""
        host = self.partition.host_ip
        env = {k: v.replace("127.0.0.1", host) if k in _SERVICE_URLS else v for k, v in self.env.items()}
        queues = ",".join(f"shard-{s:02d}" for s in range(self.settings.shards))
        argv = [
            *self.partition.exec_prefix,
            CELERY,
            "-A",
            "app",
            "worker",
            "-Q",
            queues,
            "-c",
            str(self.concurrency),
            "-n",
            f"{name}@%h",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        return Proc(name, argv, env, self.log_dir)

    def restart_worker(self, index: int) -> None:
        self.retired.append(self.workers[index])
        self.workers[index] = self._worker(index)
        wait_ready(self.workers[index], 0.3)

    def restart_beat(self) -> None:
        self.retired.append(self.beats[0])
        self.beats[0] = start_beat(self.env, self.log_dir, name=f"beat-{len(self.retired)}")

    def add_beat(self) -> None:
        self.beats.append(start_beat(self.env, self.log_dir, name=f"beat-{len(self.beats)}"))

    def _start_api(self) -> Proc:
        from bench.common import free_port

        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "api",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        return Proc(f"api-{port}", argv, self.env, self.log_dir)

    def _wait_api(self, timeout_s: float = 30.0) -> None:
        import requests

        wait_until(
            lambda: requests.get(self.api_url + "/healthz", timeout=2).status_code == 200,
            timeout_s,
            "the API",
        )

    def restart_api(self) -> None:
        self.retired.append(self.api)
        self.api = self._start_api()
        self._wait_api()

    def shard_of(self, job_id: str) -> int:
        from app.registry.sharding import shard_for

        return shard_for(uuid.UUID(job_id), self.settings.shards)

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail(lines)}" for p in self.processes() + self.retired)

    def url(self, path: str) -> str:
        """The sink's URL as the workers call it."""
        return self.sink.url(path).replace("127.0.0.1", self.target_host)

    # -- the load -----------------------------------------------------------------------

    def _write_load(self, load: Load, t0: datetime) -> tuple[dict[str, float], list[str]]:
        from tests.rows import insert_jobs, job_row, webhook_target

        shards = self.settings.shards
        once = webhook_target(self.url("/once"))
        rows, due = [], {}
        if not load.via_api:
            for i in range(load.one_offs):
                at = t0 + timedelta(seconds=load.spread_s * i / max(1, load.one_offs))
                row = job_row(
                    shards, owner=self.owner, target=once, run_at=at, payload={"n": i}, name=f"once-{i}"
                )
                rows.append(row)
                due[str(row["job_id"])] = _epoch(at)
        every = webhook_target(self.url("/every"))
        recurring = []
        for i in range(load.recurring):
            row = job_row(
                shards, owner=self.owner, target=every, interval_s=load.every_s, first=t0, name=f"every-{i}"
            )
            rows.append(row)
            recurring.append(str(row["job_id"]))
        insert_jobs(self.registry, rows)
        return due, recurring

    def _create_via_api(self, load: Load, t0: datetime, due: dict[str, float]) -> None:
        """Create the one-offs through the API as a careful client would: each with an
        Idempotency-Key, sent again until it is answered (the API may be down)."""
        import requests

        from app.core.timefmt import format_instant

        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.api_key}"}
        for i in range(load.one_offs):
            at = t0 + timedelta(seconds=load.spread_s * i / max(1, load.one_offs))
            body = {
                "name": f"once-{i}",
                "target": {"type": "webhook", "url": self.url("/once")},
                "payload": {"n": i},
                "schedule": {"run_at": format_instant(at)},
            }
            while True:
                try:
                    answer = session.post(
                        self.api_url + "/jobs",
                        json=body,
                        timeout=5,
                        headers={**headers, "Idempotency-Key": f"{self.owner}-{i}"},
                    )
                    if answer.status_code in (200, 201):
                        due[answer.json()["id"]] = _epoch(at)
                        break
                except requests.RequestException:
                    session.close()
                    session = requests.Session()
                time.sleep(0.1)

    # -- one run ------------------------------------------------------------------------

    def run(self, load: Load, fault=None) -> Outcome:
        from app.core.timefmt import utcnow

        self.sink.script("/once", [Answer(200, delay_s=load.call_delay_s)])
        self.sink.script("/every", [Answer(200, delay_s=load.call_delay_s)])
        t0_at = (utcnow() + timedelta(seconds=load.lead_s)).replace(microsecond=0)
        due, recurring = self._write_load(load, t0_at)
        t0 = _epoch(t0_at)
        creator = None
        if load.via_api:
            creator = threading.Thread(target=self._create_via_api, args=(load, t0_at, due), daemon=True)
            creator.start()
        fault_start = fault_end = None
        if fault is not None:
            _sleep_until(t0 + fault.at_s)
            if fault.after_calls:
                wait_until(
                    lambda: len(self.sink.calls("/once")) >= fault.after_calls,
                    30.0,
                    f"{fault.after_calls} calls before the fault",
                    every_s=0.01,
                )
            fault_start = time.time()
            try:
                fault.inject(self)
                if fault.again_after_s:
                    time.sleep(fault.again_after_s)
                    fault.inject(self)
                time.sleep(fault.hold_s)
            finally:
                fault.heal(self)
            fault_end = time.time()
        if creator is not None:
            creator.join(60)
            assert not creator.is_alive(), "creating the jobs through the API did not finish"
        self.one_off_ids = list(due)
        deadline = max(fault_end or t0, t0 + load.spread_s) + load.timeout_s
        self._wait_done(due, deadline)
        time.sleep(1.0)  # late duplicates (a stopped worker resumed) arrive now or never
        runs, completed = self._rows(due, recurring)
        verdict = judge(
            calls_from_headers(self.sink.calls()), runs, due, recurring, completed, t0, fault_end, fault_start
        )
        outcome = Outcome(fault.name if fault else "none", t0, fault_start, fault_end, verdict)
        print("fault run:", outcome.row())  # shown by pytest -s and on failure
        return outcome

    def _wait_done(self, due: dict[str, float], deadline: float) -> None:
        """Until every one-off was called and its job is `completed` (or the deadline)."""
        while time.time() < deadline:
            called = {c.header("Punctual-Job-Id") for c in self.sink.calls("/once")}
            if called.issuperset(due) and self._open_one_offs(due) == 0:
                return
            time.sleep(0.5)

    def _open_one_offs(self, due: dict[str, float]) -> int:
        from app.registry.schema import jobs

        ids = [uuid.UUID(j) for j in due]
        total = 0
        for engine in self.registry.engines:
            try:
                with engine.connect() as conn:
                    total += conn.execute(
                        sa.select(sa.func.count())
                        .select_from(jobs)
                        .where(jobs.c.job_id.in_(ids), jobs.c.state != "completed")
                    ).scalar_one()
            except sa.exc.OperationalError:
                return -1
        return total

    def _rows(self, due: dict[str, float], recurring: list[str]) -> tuple[list[RunRow], list[str]]:
        from app.core.timefmt import format_instant
        from app.registry.schema import jobs, runs

        rows, completed = [], []
        for engine in self.registry.engines:
            with engine.connect() as conn:
                query = sa.select(
                    runs.c.job_id,
                    runs.c.scheduled_for,
                    runs.c.attempt,
                    runs.c.state,
                    runs.c.error,
                    runs.c.finished_at,
                ).where(runs.c.owner == self.owner)
                for r in conn.execute(query):
                    finished = r.finished_at.timestamp() if r.finished_at else None
                    rows.append(
                        RunRow(
                            str(r.job_id),
                            format_instant(r.scheduled_for),
                            r.attempt,
                            r.state,
                            r.error,
                            finished,
                        )
                    )
                completed += [
                    str(j)
                    for j in conn.execute(
                        sa.select(jobs.c.job_id).where(
                            jobs.c.owner == self.owner, jobs.c.state == "completed"
                        )
                    ).scalars()
                ]
        return rows, completed

    def jobs_of_owner(self) -> int:
        from app.registry.schema import jobs

        total = 0
        for engine in self.registry.engines:
            with engine.connect() as conn:
                total += conn.execute(
                    sa.select(sa.func.count())
                    .select_from(jobs)
                    .where(jobs.c.owner == self.owner, jobs.c.schedule_kind == "once")
                ).scalar_one()
        return total


def _sleep_until(at: float) -> None:
    left = at - time.time()
    if left > 0:
        time.sleep(left)


def fault_env(pg_dsns, amqp_url: str, redis_url: str, prefix: str, **overrides: str) -> dict[str, str]:
    """The processes' environment: the shipped defaults for lease, heartbeat, poll
    interval and claim-ahead (the guarantee is about them), and a smaller footprint
    than production's for this shared box."""
    env = {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_BROKER_URL": amqp_url,
        "PUNCTUAL_REDIS_URL": redis_url,
        "PUNCTUAL_REDIS_PREFIX": prefix,
        "PUNCTUAL_SHARDS": "4",
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_DB_POOL_SIZE": "4",
        "PUNCTUAL_DISPATCH_THREADS": "64",
    }
    env.update(overrides)
    return env
