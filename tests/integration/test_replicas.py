"""Read replicas, against a real streaming replica of the test server (pg_replica).

Routing: the replica reads (docs/api.md "Replica reads") go to the replica, the rest
to the primaries; a replica whose replay is paused is skipped once it is further
behind than the bound; a stopped one is skipped; one that is not a replica of a
listed primary is refused with one line. The replica copies the whole server, so
each module database of pg_dsns is on it under the same name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from app import metrics
from app.api import create_app
from app.registry.engines import Registry, create_engine_for
from app.registry.migrate import establish_cluster
from app.registry.replicas import ReplicaError
from app.settings import Settings
from tests.conftest import _pg_url, create_database, drop_database, replica_ctl, replica_url
from tests.e2e.processes import REPO
from tests.integration.api_fixtures import new_caller

pytestmark = pytest.mark.integration

WAIT_S = 60


def settings_of(pg_dsns, max_lag_s: float) -> Settings:
    return Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_REPLICA_URLS": ",".join(replica_url(d) for d in pg_dsns),
            "PUNCTUAL_REPLICA_MAX_LAG_S": str(max_lag_s),
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DB_POOL_SIZE": "3",
        }
    )


def replica_admin(pg_replica):
    return create_engine_for(pg_replica, 1)


def caught_up(pg_replica, primary_dsn: str) -> None:
    """Wait until the replica has replayed everything the primary has written now."""
    primary = create_engine_for(primary_dsn, 1)
    replica = replica_admin(pg_replica)
    with primary.connect() as conn:
        target = conn.exec_driver_sql("SELECT pg_current_wal_lsn()").scalar()
    deadline = time.monotonic() + WAIT_S
    with replica.connect() as conn:
        while conn.exec_driver_sql("SELECT pg_last_wal_replay_lsn() < %(t)s::pg_lsn", {"t": target}).scalar():
            assert time.monotonic() < deadline, "the replica does not catch up"
            time.sleep(0.05)
    primary.dispose()
    replica.dispose()


def set_replay(pg_replica, paused: bool) -> None:
    engine = replica_admin(pg_replica)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")
    engine.dispose()


def skipped(reason: str) -> float:
    return metrics.REPLICA_SKIPPED_READS.labels(reason=reason)._value.get()


def listed(caller) -> set[str]:
    response = caller.get("/jobs")
    assert response.status_code == 200, response.get_json()
    return {job["id"] for job in response.get_json()["items"]}


@pytest.fixture
def resumed(pg_replica, pg_dsns):
    """The replica replaying and caught up before and after the test."""
    set_replay(pg_replica, paused=False)
    caught_up(pg_replica, pg_dsns[0])
    yield
    set_replay(pg_replica, paused=False)


def test_replica_reads_go_to_the_replica_and_the_others_to_the_primary(pg_replica, pg_dsns, resumed):
    settings = settings_of(pg_dsns, max_lag_s=3600)  # a paused replica stays in use
    app = create_app(settings)
    alice = new_caller(app, settings, "alice")
    Registry.check(app.extensions["punctual"].registry)
    before = alice.create(name="before")["id"]
    caught_up(pg_replica, pg_dsns[0])
    caught_up(pg_replica, pg_dsns[1])
    assert before in listed(alice)

    set_replay(pg_replica, paused=True)
    after = alice.create(name="after")  # on the primary (a write)
    assert alice.get(f"/jobs/{after['id']}").status_code == 200  # a primary read
    assert listed(alice) == {before}  # the listing is the paused replica's
    runs = alice.get(f"/jobs/{after['id']}/runs")  # not on the replica yet: read on the primary
    assert runs.status_code == 200 and runs.get_json()["items"] == []
    assert alice.get("/dead-letters").status_code == 200

    set_replay(pg_replica, paused=False)
    caught_up(pg_replica, pg_dsns[0])
    caught_up(pg_replica, pg_dsns[1])
    assert listed(alice) == {before, after["id"]}
    app.extensions["punctual"].registry.dispose()


def test_a_replica_whose_replay_is_paused_is_skipped_once_it_is_too_far_behind(pg_replica, pg_dsns, resumed):
    settings = settings_of(pg_dsns, max_lag_s=1)
    app = create_app(settings)
    alice = new_caller(app, settings, "alice")
    caught_up(pg_replica, pg_dsns[0])
    caught_up(pg_replica, pg_dsns[1])
    listed(alice)  # the replicas are probed, and fresh
    lagging = skipped("lag")

    set_replay(pg_replica, paused=True)
    job = alice.create(name="while-paused")["id"]
    deadline = time.monotonic() + WAIT_S
    while job not in listed(alice):  # on the replica it is missing until the replica is skipped
        assert time.monotonic() < deadline, "the paused replica is never skipped"
        time.sleep(0.2)
    assert skipped("lag") > lagging
    set_replay(pg_replica, paused=False)
    app.extensions["punctual"].registry.dispose()


def test_a_stopped_replica_is_skipped_and_used_again_when_it_is_back(pg_replica, pg_dsns, resumed):
    settings = settings_of(pg_dsns, max_lag_s=3600)
    app = create_app(settings)
    alice = new_caller(app, settings, "alice")
    job = alice.create(name="stopped")["id"]
    down = skipped("down")
    replica_ctl("stop")
    try:
        deadline = time.monotonic() + WAIT_S
        while skipped("down") == down:  # the first read after the stop may still pick it: retried
            assert job in listed(alice)  # served all along (by the primary once skipped)
            assert time.monotonic() < deadline, "the stopped replica is never skipped"
        assert job in listed(alice)
        assert alice.get("/dead-letters").status_code == 200
        assert alice.get(f"/jobs/{job}/runs").status_code == 200
    finally:
        replica_ctl("start")
    caught_up(pg_replica, pg_dsns[0])
    registry = app.extensions["punctual"].registry
    deadline = time.monotonic() + WAIT_S
    while not all(r.fresh for r in registry.replicas.replicas):
        assert time.monotonic() < deadline, "the replica is not used again once it is back"
        listed(alice)
        time.sleep(0.2)
    registry.dispose()


@pytest.fixture(scope="module")
def other_cluster(pg_admin, pg_template):
    name = create_database(pg_admin, pg_template)
    establish_cluster((_pg_url(name),), 16)
    yield _pg_url(name)
    drop_database(pg_admin, name)


def test_a_replica_of_another_cluster_is_refused_with_one_line(pg_replica, pg_dsns, other_cluster):
    caught_up(pg_replica, other_cluster)
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_REPLICA_URLS": f"{replica_url(pg_dsns[0])},{replica_url(other_cluster)}",
        }
    )
    registry = Registry(settings)
    with pytest.raises(
        ReplicaError, match=r"PUNCTUAL_REPLICA_URLS\[1\] is database .* of cluster .*, not of"
    ):
        registry.check()
    registry.dispose()

    env = {
        "PATH": os.environ.get("PATH", ""),
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_REPLICA_URLS": replica_url(other_cluster),
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "shards"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("punctual: PUNCTUAL_REPLICA_URLS[0] is database"), lines


def test_a_primary_listed_as_a_replica_is_refused(pg_replica, pg_dsns):
    # The same database by another host name: not in recovery, so not a replica.
    primary = sa.engine.make_url(pg_dsns[1]).set(host="localhost").render_as_string(hide_password=False)
    settings = Settings.from_env(
        {"PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns), "PUNCTUAL_REPLICA_URLS": primary}
    )
    registry = Registry(settings)
    with pytest.raises(ReplicaError, match=r"is not in recovery .*PUNCTUAL_DATABASE_URLS\[1\]"):
        registry.check()
    registry.dispose()


def test_the_census_and_the_gauges_read_the_replica(pg_replica, pg_dsns, resumed):
    settings = settings_of(pg_dsns, max_lag_s=3600)
    app = create_app(settings)
    alice = new_caller(app, settings, "alice")
    caught_up(pg_replica, pg_dsns[0])
    caught_up(pg_replica, pg_dsns[1])
    registry = app.extensions["punctual"].registry
    from app.core.timefmt import utcnow
    from app.registry.census import shard_census
    from app.services.jobs import count_by_state

    jobs_before = sum(row.jobs for row in shard_census(registry, utcnow()))
    scheduled_before = count_by_state(registry)["scheduled"]
    set_replay(pg_replica, paused=True)
    alice.create(name="unseen")
    assert sum(row.jobs for row in shard_census(registry, utcnow())) == jobs_before
    assert count_by_state(registry)["scheduled"] == scheduled_before
    set_replay(pg_replica, paused=False)
    registry.dispose()
