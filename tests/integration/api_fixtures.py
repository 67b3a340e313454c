"""Fixtures for the API, SDK and CLI tests: the real app on two Postgres shards.

tests/integration/conftest.py hands the fixtures to every module there; modules import
only the helpers (job_body, job_row, insert_run, ...).
The settings are per module (one engine pool per module, not per test); each test
gets its own owners, so tests never see each other's jobs without truncating.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

import pytest
from werkzeug.serving import make_server

from app.api import create_app
from app.registry.engines import registry_for
from app.services.owners import create_key
from app.settings import Settings

WEBHOOK = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}


def job_body(**overrides) -> dict:
    body = {
        "name": "nightly-billing",
        "target": dict(WEBHOOK),
        "schedule": {"cron": "0 0 * * *", "timezone": "Europe/Berlin"},
    }
    body.update(overrides)
    return body


@pytest.fixture(scope="module")
def api_settings(pg_dsns) -> Settings:
    """Two physical shards, 16 logical ones, private targets allowed (tests call 127.0.0.1)."""
    return Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DB_POOL_SIZE": "5",
        }
    )


@pytest.fixture(scope="module")
def api_app(api_settings):
    return create_app(api_settings)


@dataclass
class Caller:
    """A Flask test client that sends one owner's API key."""

    client: object
    api_key: str
    owner: str

    def _headers(self, headers):
        merged = {"Authorization": f"Bearer {self.api_key}"}
        merged.update(headers or {})
        return merged

    def get(self, path, headers=None, **kw):
        return self.client.get(path, headers=self._headers(headers), **kw)

    def post(self, path, json=None, headers=None, **kw):
        return self.client.post(path, json=json, headers=self._headers(headers), **kw)

    def patch(self, path, json=None, headers=None, **kw):
        return self.client.patch(path, json=json, headers=self._headers(headers), **kw)

    def delete(self, path, headers=None, **kw):
        return self.client.delete(path, headers=self._headers(headers), **kw)

    def create(self, **overrides) -> dict:
        response = self.post("/jobs", json=job_body(**overrides))
        assert response.status_code == 201, response.get_json()
        return response.get_json()


def new_caller(app, settings, owner_prefix: str = "owner") -> Caller:
    owner = f"{owner_prefix}-{uuid.uuid4().hex[:8]}"
    key = create_key(registry_for(settings), owner)
    return Caller(app.test_client(), key.api_key, owner)


@pytest.fixture
def alice(api_app, api_settings) -> Caller:
    return new_caller(api_app, api_settings, "alice")


@pytest.fixture
def bob(api_app, api_settings) -> Caller:
    return new_caller(api_app, api_settings, "bob")


@pytest.fixture(scope="module")
def live_server(api_app):
    """The app on a real threaded HTTP server (werkzeug), for the SDK and concurrency tests."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log per request
    server = make_server("127.0.0.1", 0, api_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(5)


# --- direct registry access: play the poller's and the worker's part ------------------


def engine_of(settings: Settings, job_id):
    from app.services.jobs import locate

    return locate(registry_for(settings), str(job_id))


def set_job(settings: Settings, job_id, **values) -> None:
    """Write job columns as a poller or worker would (e.g. state='running' with a lease)."""
    import sqlalchemy as sa

    from app.registry.schema import jobs

    engine, key = engine_of(settings, job_id)
    with engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.job_id == key).values(**values))


def job_row(settings: Settings, job_id) -> dict:
    import sqlalchemy as sa

    from app.registry.schema import jobs

    engine, key = engine_of(settings, job_id)
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(jobs).where(jobs.c.job_id == key)).mappings().one())


def run_rows(settings: Settings, job_id) -> list[dict]:
    import sqlalchemy as sa

    from app.registry.schema import runs

    engine, key = engine_of(settings, job_id)
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(
                sa.select(runs).where(runs.c.job_id == key).order_by(runs.c.created_at)
            ).mappings()
        ]


def insert_run(settings: Settings, job: dict, **values) -> dict:
    """A run row as the pipeline writes it (default: a dead schedule run of `job`)."""
    from datetime import timedelta

    from app.core.timefmt import parse_instant, utcnow
    from app.registry.schema import runs

    engine, key = engine_of(settings, job["id"])
    now = utcnow()
    row = {
        "run_id": uuid.uuid4(),
        "job_id": key,
        "shard": job_row(settings, key)["shard"],
        "owner": job_row(settings, key)["owner"],
        "origin": "schedule",
        "scheduled_for": parse_instant(job["next_run_at"]) if job.get("next_run_at") else now,
        "attempt": 3,
        "state": "dead",
        "lease_token": None,
        "leased_until": None,
        "due_at": now,
        "published": True,
        "target": job["target"],
        "retry": job["retry"],
        "started_at": now - timedelta(seconds=2),
        "finished_at": now - timedelta(seconds=1),
        "lateness_ms": 12,
        "status_code": 500,
        "error": "HTTP 500",
        "created_at": now,
        "updated_at": now,
    }
    row.update(values)
    with engine.begin() as conn:
        conn.execute(runs.insert().values(row))
    return row
