"""Exactly one inbox row per occurrence, with real processes and real failures.

A burst of postgres-target jobs all due at once; mid-burst the worker is SIGKILLed
(its runs in flight are taken back after their leases and attempted again by a
second worker) and every connection to the target database is cut. However often
an occurrence was attempted, the inbox ends with exactly one row for each.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest
import sqlalchemy as sa

from app.core.timefmt import format_instant, utcnow
from app.registry.engines import registry_for
from app.registry.schema import jobs, runs
from tests.conftest import _pg_url, create_database, drop_database
from tests.e2e.conftest import Api, make_env
from tests.e2e.processes import REPO, child_env, start_beat, start_worker, wait_ready

pytestmark = pytest.mark.e2e

BURST = 1000
WAIT_S = 240


@pytest.fixture(scope="module")
def billing(pg_admin):
    name = create_database(pg_admin)
    yield name
    drop_database(pg_admin, name)


@pytest.fixture(scope="module")
def stack_env(pg_dsns, amqp_url, module_redis_prefix, billing) -> dict[str, str]:
    return make_env(
        pg_dsns,
        amqp_url,
        module_redis_prefix,
        PUNCTUAL_TARGET_DATABASES=f"billing={_pg_url(billing)}",
        PUNCTUAL_TARGET_DATABASE_OWNERS="billing=*",
    )


def inbox(billing: str, sql: str):
    with psycopg.connect(_pg_url(billing)) as conn:
        return conn.execute(sql).fetchone()


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_killed_worker_and_cut_connections_leave_exactly_one_row_per_occurrence(
    stack_env, settings, logs, billing, pg_admin
):
    init = subprocess.run(
        [sys.executable, "-m", "app.cli", "targets", "init", "billing"],
        env=child_env(stack_env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert init.returncode == 0, init.stderr
    api = Api(settings, owner="inbox")
    now = format_instant(utcnow())
    body = {
        "jobs": [
            {
                "name": f"invoice-{i}",
                "target": {"type": "postgres", "database": "billing"},
                "schedule": {"run_at": now},
                "payload": {"invoice": i},
            }
            for i in range(BURST)
        ]
    }
    answer = api.request("POST", "/jobs/batch", body, expect=200)
    assert [item["status"] for item in answer["items"]] == [201] * BURST

    doomed = start_worker(stack_env, logs, name="doomed")
    beat = start_beat(stack_env, logs)
    heir = None
    try:
        wait_ready(doomed, 1.0)
        count = "SELECT count(*) FROM punctual_inbox"
        wait_until(lambda: inbox(billing, count)[0] >= BURST // 4, "the first worker writes no rows")
        doomed.kill()
        heir = start_worker(stack_env, logs, name="heir")
        wait_until(lambda: inbox(billing, count)[0] >= BURST // 2, "the second worker writes no rows")
        with pg_admin.connect() as conn:  # every connection to the target database, cut
            cut = conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                f"WHERE datname = '{billing}' AND pid <> pg_backend_pid()"
            ).scalar()
        assert cut > 0

        registry = registry_for(settings)

        def settled() -> bool:
            left = 0
            for engine in registry.engines:
                with engine.connect() as conn:
                    query = sa.select(sa.func.count()).where(
                        jobs.c.owner == "inbox", jobs.c.state != "completed"
                    )
                    left += conn.execute(query).scalar_one()
            return left == 0

        wait_until(settled, "the burst never completes")
        total, distinct = inbox(billing, "SELECT count(*), count(DISTINCT job_id) FROM punctual_inbox")
        assert (total, distinct) == (BURST, BURST)
        # The kill made attempts again (leases expired): the rows stayed one each.
        retried = 0
        for engine in registry.engines:
            with engine.connect() as conn:
                query = sa.select(sa.func.count()).where(runs.c.owner == "inbox", runs.c.attempt > 1)
                retried += conn.execute(query).scalar_one()
        assert retried > 0
    finally:
        beat.stop()
        for proc in (doomed, heir):
            if proc is not None:
                proc.stop()
