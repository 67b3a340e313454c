"""A process stopped in the middle of a transaction (SIGSTOP, a frozen VM) does not keep
its row locks: the server ends the transaction once it has been idle for
IDLE_IN_TRANSACTION_S, so other pollers claim the rows it had locked."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from app.core.timefmt import utcnow
from app.registry import engines
from app.registry.engines import create_engine_for, registry_for
from app.registry.schema import jobs
from app.settings import Settings
from tests.rows import insert_jobs, job_row


@pytest.fixture
def dsn(pg_dsns) -> str:
    return pg_dsns[0]


def test_every_connection_ends_a_transaction_left_idle(dsn):
    engine = create_engine_for(dsn, pool_size=1)
    try:
        with engine.connect() as conn:
            shown = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
        assert shown == f"{engines.IDLE_IN_TRANSACTION_S}s"
    finally:
        engine.dispose()


def test_rows_locked_by_a_stalled_transaction_are_claimable_once_it_is_ended(dsn, pg_dsns, monkeypatch):
    registry = registry_for(Settings.from_env({"PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns)}))
    row = job_row(2, shard=0, run_at=utcnow())
    insert_jobs(registry, [row])
    monkeypatch.setattr(engines, "IDLE_IN_TRANSACTION_S", 0.5)
    stalled, other = create_engine_for(dsn, pool_size=1), create_engine_for(dsn, pool_size=1)
    locked = sa.select(jobs.c.job_id).where(jobs.c.job_id == row["job_id"]).with_for_update(skip_locked=True)
    try:
        with stalled.connect() as held:
            held.begin()
            assert held.execute(locked).scalar() == row["job_id"]
            with other.connect() as conn, conn.begin():
                assert conn.execute(locked).scalar() is None  # locked: skipped
            time.sleep(1.5)  # the holder sends nothing meanwhile, as if stopped
            with other.connect() as conn, conn.begin():
                assert conn.execute(locked).scalar() == row["job_id"]
            with pytest.raises(sa.exc.DBAPIError):  # its transaction is gone
                held.execute(sa.select(1))
    finally:
        stalled.dispose()
        other.dispose()
