"""Named limits keys: the last job created or updated with a key sets its limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.limits.keys import LimitKeyDirectory, record_limit_key
from app.registry.engines import Registry
from app.registry.migrate import migrate_all
from app.settings import Settings

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _target(key: str | None, **limits) -> dict:
    body = {"type": "webhook", "url": "https://api.example/hook"}
    if key or limits:
        body["limits"] = {**({"key": key} if key else {}), **limits}
    return body


@pytest.fixture(params=["postgresql", "sqlite"])
def registry(request, pg_settings, tmp_path):
    if request.param == "postgresql":
        settings = pg_settings
    else:
        settings = Settings.from_env({"PUNCTUAL_DATA_DIR": str(tmp_path)})
        migrate_all(settings.database_urls, shards=settings.shards)
    reg = Registry(settings)
    yield reg
    if request.param == "postgresql":
        with reg.home.begin() as conn:
            conn.exec_driver_sql("DELETE FROM limit_keys")
    reg.dispose()


def test_the_most_recent_job_with_a_key_sets_its_limits(registry):
    record_limit_key(registry, "acme", _target("billing", rate_per_s=50, max_concurrency=20), NOW)
    record_limit_key(registry, "acme", _target("billing", rate_per_s=5), NOW + timedelta(seconds=1))
    record_limit_key(registry, "other", _target("billing", max_concurrency=3), NOW)
    record_limit_key(registry, "acme", _target(None, rate_per_s=9), NOW)  # no key: nothing recorded
    found = LimitKeyDirectory(registry, ttl_s=0).lookup_many(
        [("acme", "billing"), ("other", "billing"), ("acme", "unknown")]
    )
    assert found == {("acme", "billing"): (5.0, None), ("other", "billing"): (None, 3)}


def test_lookups_are_cached_for_their_ttl(registry):
    record_limit_key(registry, "acme", _target("reports", rate_per_s=2), NOW)
    directory = LimitKeyDirectory(registry, ttl_s=3600)
    assert directory.lookup_many([("acme", "reports")]) == {("acme", "reports"): (2.0, None)}
    record_limit_key(registry, "acme", _target("reports", rate_per_s=7), NOW)
    assert directory.lookup_many([("acme", "reports")]) == {("acme", "reports"): (2.0, None)}
    assert LimitKeyDirectory(registry, ttl_s=0).lookup_many([("acme", "reports")]) == {
        ("acme", "reports"): (7.0, None)
    }
