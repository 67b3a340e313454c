"""`postgres` targets: grants, `punctual targets init`, the inbox write and its consumer.

Against a real target database: an occurrence attempted again and again makes one
row; an owner never reaches a database it was not granted; a missing inbox table is
a retryable failure that names the fix; consume_inbox handles each row once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
import sqlalchemy as sa

from app.api import create_app
from app.settings import Settings
from app.worker.inbox import InboxCall, InboxWriter
from punctual_client.inbox import consume_inbox
from tests.conftest import _pg_url, create_database, drop_database
from tests.e2e.processes import REPO
from tests.integration.api_fixtures import job_body, new_caller

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def billing(pg_admin):
    name = create_database(pg_admin)
    yield _pg_url(name)
    drop_database(pg_admin, name)


@pytest.fixture(scope="module")
def target_env(pg_dsns, billing) -> dict[str, str]:
    return {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_TARGET_DATABASES": f"billing={billing};ledger={billing}",
        "PUNCTUAL_TARGET_DATABASE_OWNERS": "billing=*;ledger=ledger-owner",
    }


def punctual(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=REPO,
        timeout=60,
    )


@pytest.fixture(scope="module")
def initialised(target_env):
    done = punctual(["targets", "init", "billing"], target_env)
    assert done.returncode == 0, done.stderr
    again = punctual(["targets", "init", "billing"], target_env)  # safe to repeat
    assert again.returncode == 0 and again.stdout.strip() == "billing: punctual_inbox ready"
    return target_env


def inbox_rows(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        columns = "idempotency_key, job_id, attempt, payload, done_at"
        return conn.execute(f"SELECT {columns} FROM punctual_inbox ORDER BY inserted_at").fetchall()


def clear(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE punctual_inbox")


def call(owner: str = "alice", database: str = "billing", attempt: int = 1, job_id: str | None = None):
    return InboxCall(
        job_id or str(uuid.uuid4()),
        owner,
        datetime(2026, 3, 1, 9, 0, tzinfo=UTC),
        attempt,
        database,
        {"invoice": 42},
    )


def test_an_occurrence_attempted_again_and_again_makes_one_row(initialised, billing):
    clear(billing)
    writer = InboxWriter(Settings.from_env(initialised))
    first = call()
    outcomes = [writer.write(call(job_id=first.job_id, attempt=n)) for n in range(1, 6)]
    assert all(o.succeeded for o in outcomes)
    other = writer.write(call())  # another occurrence: its own row
    assert other.succeeded
    rows = inbox_rows(billing)
    assert len(rows) == 2
    key, job_id, attempt, payload, done_at = rows[0]
    assert key == f"{first.job_id}:2026-03-01T09:00:00Z" and str(job_id) == first.job_id
    assert attempt == 1 and payload == {"invoice": 42} and done_at is None
    writer.close()


def test_an_owner_never_reaches_a_database_it_was_not_granted(initialised, billing):
    clear(billing)
    writer = InboxWriter(Settings.from_env(initialised))
    refused = writer.write(call(owner="mallory", database="ledger"))
    assert not refused.succeeded and not refused.retryable_error
    assert "not granted" in refused.error
    unknown = writer.write(call(database="nowhere"))
    assert not unknown.succeeded and not unknown.retryable_error
    assert writer.write(call(owner="ledger-owner", database="ledger")).succeeded
    assert len(inbox_rows(billing)) == 1
    writer.close()


def test_the_api_refuses_a_target_database_the_owner_was_not_granted(initialised):
    settings = Settings.from_env(initialised)
    app = create_app(settings)
    alice = new_caller(app, settings, "alice")
    for database in ("ledger", "nowhere"):
        answer = alice.post("/jobs", json=job_body(target={"type": "postgres", "database": database}))
        assert answer.status_code == 422
        fields = [e["field"] for e in answer.get_json()["errors"]]
        assert fields == ["target.database"]
    bad = alice.post("/jobs", json=job_body(target={"type": "postgres", "database": "Bad Alias", "dsn": "x"}))
    assert bad.status_code == 422
    assert {e["field"] for e in bad.get_json()["errors"]} == {"target.database", "target.dsn"}
    created = alice.post("/jobs", json=job_body(target={"type": "postgres", "database": "billing"}))
    assert created.status_code == 201
    assert created.get_json()["target"]["database"] == "billing"
    batch = alice.post(
        "/jobs/batch", json={"jobs": [job_body(target={"type": "postgres", "database": "ledger"})]}
    )
    assert batch.get_json()["items"][0]["status"] == 422
    app.extensions["punctual"].registry.dispose()


def test_a_missing_inbox_table_is_retried_and_names_the_fix(pg_admin, pg_dsns):
    name = create_database(pg_admin)
    try:
        env = {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_TARGET_DATABASES": f"fresh={_pg_url(name)}",
            "PUNCTUAL_TARGET_DATABASE_OWNERS": "fresh=*",
        }
        writer = InboxWriter(Settings.from_env(env))
        outcome = writer.write(call(database="fresh"))
        assert not outcome.succeeded and outcome.retryable_error
        assert "punctual targets init fresh" in outcome.error
        writer.close()
    finally:
        drop_database(pg_admin, name)


def test_targets_init_of_an_unknown_alias_is_one_line(initialised):
    done = punctual(["targets", "init", "payroll"], initialised)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "punctual: 'payroll' is not in PUNCTUAL_TARGET_DATABASES (it names billing, ledger)"
    ]
    listing = punctual(["targets"], initialised)
    assert listing.stdout.splitlines() == ["billing: *", "ledger: ledger-owner"]


def test_consume_inbox_handles_each_row_once_and_a_failure_leaves_them_pending(initialised, billing):
    clear(billing)
    writer = InboxWriter(Settings.from_env(initialised))
    for _ in range(5):
        assert writer.write(call()).succeeded
    writer.close()
    with psycopg.connect(billing) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS handled (key text PRIMARY KEY)")
        conn.commit()

        def fail(_cursor, _row):
            raise RuntimeError("the application failed")

        with pytest.raises(RuntimeError):
            consume_inbox(conn, fail, limit=2)
        assert [r for r in inbox_rows(billing) if r[4] is not None] == []

        def handle(cursor, row):
            cursor.execute("INSERT INTO handled VALUES (%s)", (row.idempotency_key,))

        assert consume_inbox(conn, handle, limit=3) == 3
        assert consume_inbox(conn, handle, limit=3) == 2
        assert consume_inbox(conn, handle, limit=3) == 0
        handled = [r[0] for r in conn.execute("SELECT key FROM handled").fetchall()]
    assert sorted(handled) == sorted(r[0] for r in inbox_rows(billing))
    assert all(r[4] is not None for r in inbox_rows(billing))
    engine = sa.create_engine(billing.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE handled")
    engine.dispose()
