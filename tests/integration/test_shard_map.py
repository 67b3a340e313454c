"""The stored shard map: written once by migrate, read and followed by every process,
a DSN list that loses a database refused by each of them with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from app.registry.engines import Registry
from app.registry.migrate import migrate_all
from app.registry.schema import owners, shard_map
from app.registry.shard_map import Placement, ShardMapError, read_identity, set_placement
from app.services.owners import create_key
from app.settings import Settings
from tests.conftest import _pg_url, create_database, drop_database
from tests.e2e.processes import CELERY, REPO

pytestmark = pytest.mark.integration

SHARDS = 8


@pytest.fixture(scope="module")
def three(pg_admin, pg_template):
    """Three migrated databases: the first two a cluster of 8 shards, the third added later."""
    names = [create_database(pg_admin, pg_template) for _ in range(3)]
    dsns = [_pg_url(n) for n in names]
    migrate_all(tuple(dsns[:2]), shards=SHARDS)
    yield dsns
    for name in names:
        drop_database(pg_admin, name)


def registry_of(*dsns: str) -> Registry:
    return Registry(
        Settings.from_env({"PUNCTUAL_DATABASE_URLS": ",".join(dsns), "PUNCTUAL_SHARDS": str(SHARDS)})
    )


def _punctual(args: list[str], dsns: list[str]) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PUNCTUAL_DATABASE_URLS": ",".join(dsns),
        "PUNCTUAL_SHARDS": str(SHARDS),
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_the_first_migrate_writes_the_map_and_a_later_one_never_rewrites_it(three):
    registry = registry_of(*three[:2])
    routing = registry.reload_map()
    assert routing.shard_index == (0, 1, 0, 1, 0, 1, 0, 1)
    version = routing.map.version
    migrate_all(tuple(three[:2]), shards=SHARDS)
    assert registry.reload_map().map.version == version
    registry.dispose()


def test_a_dsn_added_at_the_end_gets_an_identity_and_holds_nothing(three):
    migrate_all(tuple(three), shards=SHARDS)
    registry = registry_of(*three)
    routing = registry.reload_map()
    assert routing.shards_of(2) == []
    assert routing.shard_index == (0, 1, 0, 1, 0, 1, 0, 1)
    identity = read_identity(registry.engines[2])
    assert identity.created_index == 2 and identity.cluster_id == routing.map.cluster_id
    registry.dispose()


def test_a_swapped_list_is_served_by_identity(three):
    ordered, swapped = registry_of(*three[:2]), registry_of(three[1], three[0])
    key = create_key(swapped, "swapped-owner")
    with ordered.engines[0].connect() as conn:  # the home, wherever the list puts it
        assert conn.execute(sa.select(owners.c.owner).where(owners.c.owner == "swapped-owner")).scalar()
    assert swapped.engine_for_shard(1) is swapped.engines[0]  # shard 1 lives on three[1]
    assert key.owner == "swapped-owner"
    ordered.dispose()
    swapped.dispose()


def test_a_dropped_database_is_refused_by_the_registry(three):
    registry = registry_of(three[0])
    with pytest.raises(ShardMapError, match=r"shards 1,3,5,7 on database"):
        registry.check()
    registry.dispose()


@pytest.mark.parametrize("command", [["shards"], ["keys", "create", "--owner", "x"], ["migrate"]])
def test_the_cli_refuses_a_dropped_database_with_one_line(three, command):
    result = _punctual(command, [three[0], three[2]])
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "shards 1,3,5,7" in lines[0] and lines[0].startswith("punctual: ")


def test_the_cli_refuses_a_database_that_is_not_migrated(three, pg_admin):
    name = create_database(pg_admin)
    try:
        result = _punctual(["shards"], [*three[:2], _pg_url(name)])
        assert result.returncode != 0
        assert result.stderr.strip() == (
            "punctual: PUNCTUAL_DATABASE_URLS[2] is not a migrated Punctual database: run `punctual migrate`"
        )
    finally:
        drop_database(pg_admin, name)


@pytest.mark.parametrize("kind", ["worker", "beat"])
def test_worker_and_beat_refuse_a_dropped_database_at_start(three, kind, tmp_path):
    env = {
        **os.environ,
        "PUNCTUAL_DATABASE_URLS": three[1],
        "PUNCTUAL_SHARDS": str(SHARDS),
        "PUNCTUAL_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
    }
    argv = [CELERY, "-A", "app", kind, "--loglevel", "WARNING"]
    if kind == "worker":
        argv += ["-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert result.returncode != 0
    refusal = [line for line in result.stderr.splitlines() if line.startswith("punctual: ")]
    assert len(refusal) == 1 and "home database" in refusal[0], result.stderr[-2000:]


def test_the_api_refuses_a_dropped_database_at_start(three):
    result = _punctual(["api", "--port", "0"], [three[0]])
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("punctual: the shard map puts shards 1,3,5,7")


def test_shards_lists_every_shard_with_its_database(three):
    result = _punctual(["shards", "--json"], list(three))
    assert result.returncode == 0, result.stderr
    import json

    rows = json.loads(result.stdout)
    assert [(r["shard"], r["database"]) for r in rows] == [(s, s % 2) for s in range(SHARDS)]
    assert {"jobs", "due_now", "oldest_due", "in_flight"} <= set(rows[0])
    text = _punctual(["shards"], list(three))
    assert text.returncode == 0 and len(text.stdout.strip().splitlines()) == SHARDS + 1


def test_a_process_follows_a_change_of_the_map(three):
    migrate_all(tuple(three), shards=SHARDS)
    follower, writer = registry_of(*three), registry_of(*three)
    follower.map_refresh_s = 0.2
    assert follower.routing().shard_index[6] == 0
    home_id = follower.routing().identities[0].database_id
    try:
        with writer.home.begin() as conn:
            set_placement(
                conn, 6, Placement(home_id, follower.routing().identities[2].database_id, "fenced"), _now()
            )
        deadline = time.monotonic() + 5
        while not follower.routing().fenced(6):
            assert time.monotonic() < deadline, "the map change was not followed"
            time.sleep(0.05)
    finally:
        with writer.home.begin() as conn:
            set_placement(conn, 6, Placement(home_id), _now())
            assert (
                conn.execute(sa.select(shard_map.c.move_step).where(shard_map.c.shard == 6)).scalar() is None
            )
        follower.dispose()
        writer.dispose()


def _now():
    from app.core.timefmt import utcnow

    return utcnow()


def test_shards_move_says_what_is_wrong_in_one_line(three):
    migrate_all(tuple(three), shards=SHARDS)
    nothing = _punctual(["shards", "move", "--abort", "3"], list(three))
    assert nothing.returncode == 1 and nothing.stderr.strip() == "punctual: no move of shard 3 is in progress"
    already = _punctual(["shards", "move", "3", "--to", "1"], list(three))
    assert already.returncode == 1
    assert already.stderr.strip() == "punctual: shard 3 is already on PUNCTUAL_DATABASE_URLS[1]"
    neither = _punctual(["shards", "move", "3"], list(three))
    assert neither.returncode == 2 and "give either --to INDEX or --abort" in neither.stderr
