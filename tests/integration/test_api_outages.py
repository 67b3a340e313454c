"""The API when a dependency is down, and the past run_at rule.

Real Postgres: the module's databases are taken down for new and existing
sessions (ALLOW_CONNECTIONS false, then every backend terminated) and brought back,
which is what a failed primary looks like to the API, without stopping the shared
server. Real RabbitMQ for /healthz, and a port where nothing listens for a broker
that is down.
"""

from __future__ import annotations

import contextlib
import socket
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.api import create_app
from app.core.timefmt import format_instant, utcnow
from app.settings import Settings
from tests.integration.api_fixtures import job_body, new_caller

pytestmark = pytest.mark.integration


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def settings(pg_dsns, amqp_url) -> Settings:
    return Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_BROKER_URL": amqp_url,
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DB_POOL_SIZE": "2",
            "PUNCTUAL_MISFIRE_GRACE_S": "60",
        }
    )


@pytest.fixture(scope="module")
def app(settings):
    return create_app(settings)


@contextlib.contextmanager
def databases_down(pg_admin, pg_dsns):
    names = [sa.engine.make_url(dsn).database for dsn in pg_dsns]
    with pg_admin.connect() as conn:
        for name in names:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            conn.exec_driver_sql(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            )
    try:
        yield
    finally:
        with pg_admin.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def test_creating_a_job_with_the_database_down_answers_503_with_a_problem(app, settings, pg_admin, pg_dsns):
    caller = new_caller(app, settings)
    caller.create()  # the key is known and cached, as on a busy API
    with databases_down(pg_admin, pg_dsns):
        response = caller.post("/jobs", json=job_body())
        listing = caller.get("/jobs")
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    problem = response.get_json()
    assert problem["status"] == 503 and problem["type"].endswith("registry-unavailable"), problem
    assert problem["errors"] == [] and "retry" in problem["detail"]
    assert response.headers["Retry-After"].isdigit()
    assert listing.status_code == 503
    assert caller.post("/jobs", json=job_body()).status_code == 201  # and back once the database is


def test_healthz_reports_the_broker(app):
    response = app.test_client().get("/healthz")
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["broker"] == {"ok": True}


def test_healthz_is_503_when_the_broker_is_down(settings):
    down = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(settings.database_urls),
            "PUNCTUAL_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{_dead_port()}//",
        }
    )
    response = create_app(down).test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["broker"]["ok"] is False and "broker unreachable" in body["broker"]["error"]
    assert "guest" not in body["broker"]["error"]  # no credentials in the answer
    assert all(shard["ok"] for shard in body["shards"])  # the registry is fine; only the broker is not


@pytest.mark.parametrize("seconds_ago, status", [(5, 201), (59, 201), (61, 422), (86_400, 422)])
def test_a_run_at_in_the_past_is_refused_beyond_the_misfire_grace(app, settings, seconds_ago, status):
    caller = new_caller(app, settings)
    run_at = format_instant(utcnow() - timedelta(seconds=seconds_ago))
    response = caller.post("/jobs", json=job_body(schedule={"run_at": run_at}))
    assert response.status_code == status, response.get_json()
    if status == 422:
        [error] = response.get_json()["errors"]
        assert error["field"] == "schedule.run_at"
        assert "in the past" in error["message"] and "PUNCTUAL_MISFIRE_GRACE_S" in error["message"]


def test_a_patch_to_a_run_at_past_the_grace_is_refused(app, settings):
    caller = new_caller(app, settings)
    job = caller.create(schedule={"run_at": format_instant(utcnow() + timedelta(hours=1))})
    past = format_instant(utcnow() - timedelta(hours=1))
    response = caller.patch(f"/jobs/{job['id']}", json={"schedule": {"run_at": past}})
    assert response.status_code == 422, response.get_json()
    assert [e["field"] for e in response.get_json()["errors"]] == ["schedule.run_at"]
