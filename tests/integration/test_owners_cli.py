"""`punctual owners`: weights stored with the owner, and what each owner has on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.services.owners import OwnerDirectory, create_key, weights
from tests.rows import insert_jobs, job_row

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    registry = registry_for(pg_settings)
    with registry.home.begin() as conn:
        conn.exec_driver_sql("DELETE FROM api_keys")
        conn.exec_driver_sql("DELETE FROM owners")
    return registry


def _punctual(pg_settings, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_settings.database_urls),
        "PUNCTUAL_SHARDS": str(pg_settings.shards),
        "PUNCTUAL_OWNER_MAX_IN_FLIGHT": "40",
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "owners", *args], capture_output=True, text=True, env=env
    )


def test_set_stores_the_weight_and_list_shows_weight_quota_due_waiting_and_running(registry, pg_settings):
    for owner in ("acme", "globex"):
        create_key(registry, owner)
    now = utcnow()
    insert_jobs(
        registry,
        [
            job_row(pg_settings.shards, owner="acme", run_at=now - timedelta(seconds=5), shard=0)
            for _ in range(4)
        ],
    )
    insert_jobs(
        registry, [job_row(pg_settings.shards, owner="globex", run_at=now - timedelta(seconds=5), shard=0)]
    )
    claimed = claim_batch(registry.engine_for_shard(0), 0, now, pg_settings, limit=3)
    started = next(run for run in claimed.runs if run.owner == "acme")
    assert lease.start(registry, [started], utcnow())

    done = _punctual(pg_settings, "set", "acme", "--weight", "3")
    assert done.returncode == 0, done.stderr
    assert weights(registry) == {"acme": 3}

    listed = _punctual(pg_settings, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    # The batch of 3 gave acme 2 and globex 1 (equal weights when it was claimed).
    assert rows == [
        {
            "owner": "acme",
            "weight": 3,
            "paused": False,
            "due": 2,
            "waiting": 1,
            "running": 1,
            "max_in_flight": 40,
        },
        {
            "owner": "globex",
            "weight": 1,
            "paused": False,
            "due": 0,
            "waiting": 1,
            "running": 0,
            "max_in_flight": 40,
        },
    ]
    table = _punctual(pg_settings)  # `punctual owners` alone lists too
    assert table.returncode == 0 and table.stdout.splitlines()[1].split() == [
        "acme",
        "3",
        "40",
        "2",
        "1",
        "1",
        "on",
    ]


def test_an_unknown_owner_or_a_bad_weight_is_refused_with_one_line(registry, pg_settings):
    create_key(registry, "acme")
    unknown = _punctual(pg_settings, "set", "nobody", "--weight", "2")
    assert unknown.returncode == 1 and unknown.stderr.strip() == (
        "punctual: no owner 'nobody' (owners are made by `punctual keys create --owner`)"
    )
    bad = _punctual(pg_settings, "set", "acme", "--weight", "0")
    assert bad.returncode == 2 and "--weight" in bad.stderr
    assert weights(registry) == {}


def test_the_directory_caches_weights_for_the_claim(registry):
    create_key(registry, "acme")
    directory = OwnerDirectory(registry, ttl_s=60)
    assert directory.weights() == {}
    with registry.home.begin() as conn:
        conn.exec_driver_sql("UPDATE owners SET weight = 5 WHERE owner = 'acme'")
    assert directory.weights() == {}  # cached: the claim asks before every batch
    assert OwnerDirectory(registry, ttl_s=0).weights() == {"acme": 5}


def test_a_messages_owners_secrets_are_read_in_one_query_and_then_served_from_the_cache(registry):
    for name in ("acme", "globex"):
        create_key(registry, name)
    directory = OwnerDirectory(registry)
    statements: list[str] = []

    def count(conn, cursor, statement, *_args):
        statements.append(statement)

    sa.event.listen(registry.home, "before_cursor_execute", count)
    try:
        directory.prefetch_secrets(["acme", "globex", "nobody", "acme"])
        assert len(statements) == 1
        assert len(directory.signing_secrets("acme")) == 1 and len(directory.signing_secrets("globex")) == 1
        assert directory.signing_secrets("nobody") == ()  # an unknown owner is cached too
        directory.prefetch_secrets(["acme", "globex", "nobody"])
        assert len(statements) == 1, statements
    finally:
        sa.event.remove(registry.home, "before_cursor_execute", count)
