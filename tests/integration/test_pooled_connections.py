"""Pooled connections to PostgreSQL (app.registry.engines): one the server ended while
it sat in the pool is replaced when it is checked out, with no round trip before a
healthy one and no error for its next user."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from app.registry.engines import closed_by_server, create_engine_for


@pytest.fixture
def engine(pg_dsns):
    engine = create_engine_for(pg_dsns[0], pool_size=1)
    yield engine
    engine.dispose()


def _backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()


def _terminate(pg_admin, pid: int) -> None:
    """End a backend as a restart or an operator would, and wait until it is gone (it
    has sent its error and closed the socket by then)."""
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        deadline = time.monotonic() + 10
        while conn.exec_driver_sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").scalar():
            assert time.monotonic() < deadline, "the backend did not end"
            time.sleep(0.02)


def test_a_healthy_idle_connection_is_handed_out_again(engine):
    first = _backend_pid(engine)
    time.sleep(0.1)
    assert _backend_pid(engine) == first


def test_a_connection_the_server_ended_in_the_pool_is_replaced_without_an_error(engine, pg_admin):
    first = _backend_pid(engine)
    _terminate(pg_admin, first)
    # The next user of the pool gets a new connection, not the error of the dead one.
    second = _backend_pid(engine)
    assert second != first
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1


def test_closed_by_server_tells_an_ended_connection_from_a_live_one(engine, pg_admin):
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert not closed_by_server(driver)
        with driver.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            row = cursor.fetchone()
        driver.rollback()
        assert row is not None and not closed_by_server(driver)
        _terminate(pg_admin, row[0])
        assert closed_by_server(driver)
    finally:
        raw.invalidate()
        raw.close()
