"""/healthz, /metrics, /openapi.json: no API key, every shard, every route in the document."""

from __future__ import annotations

import dataclasses

import pytest

from app.api import create_app
from app.api.openapi import document
from app.api.serialize import job_json, run_json
from app.services.validation import JOB_FIELDS, LIMITS_FIELDS, QUEUE_FIELDS, REQUIRED_FIELDS, WEBHOOK_FIELDS
from tests.integration.api_fixtures import insert_run, job_row

pytestmark = pytest.mark.integration


def test_healthz_lists_every_logical_shard(api_app, api_settings):
    response = api_app.test_client().get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {
        "shards": [{"shard": s, "ok": True} for s in range(api_settings.shards)],
        "broker": {"ok": True},
    }  # the embedded broker; RabbitMQ: test_api_outages


def test_healthz_is_503_naming_the_shards_of_a_dead_dsn(api_settings):
    dead = "postgresql://root@127.0.0.1:5432/pt_does_not_exist"
    settings = dataclasses.replace(api_settings, database_urls=(api_settings.database_urls[0], dead))
    response = create_app(settings).test_client().get("/healthz")
    assert response.status_code == 503
    shards = response.get_json()["shards"]
    assert [s["shard"] for s in shards if not s["ok"]] == list(range(1, settings.shards, 2))
    assert all(s["ok"] for s in shards if s["shard"] % 2 == 0)
    assert all("pt_does_not_exist" not in s.get("error", "") for s in shards)  # the DSN stays private


def test_metrics_are_prometheus_text_with_registry_gauges(alice, api_settings):
    job = alice.create()
    insert_run(api_settings, job)
    response = alice.client.get("/metrics")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    for name in (
        'punctual_jobs{state="scheduled"}',
        "punctual_dead_letter_runs",
        "punctual_claims_total",
        "punctual_runs_total",
        "punctual_start_lateness_seconds",
        "punctual_dead_letters_total",
    ):
        assert name in text or name.split("{")[0] in text, name
    scheduled = float(
        next(
            line for line in text.splitlines() if line.startswith('punctual_jobs{state="scheduled"}')
        ).split()[-1]
    )
    assert scheduled >= 1


def test_metrics_gauges_are_cached(api_settings, alice):
    app = create_app(api_settings)
    gauges = app.extensions["punctual"].gauges
    first = app.test_client().get("/metrics").get_data(as_text=True)
    alice.create()
    second = app.test_client().get("/metrics").get_data(as_text=True)

    def pick(text: str) -> str:
        return next(line for line in text.splitlines() if line.startswith('punctual_jobs{state="scheduled"}'))

    assert pick(first) == pick(second)  # within the TTL: no second count over every DSN
    gauges._expires = 0
    assert pick(app.test_client().get("/metrics").get_data(as_text=True)) != pick(first)


def test_openapi_covers_every_route_and_method(api_app):
    response = api_app.test_client().get("/openapi.json")
    assert response.status_code == 200
    doc = response.get_json()
    assert doc["openapi"].startswith("3.1")
    for rule in api_app.url_map.iter_rules():
        path = rule.rule.replace("<", "{").replace(">", "}")
        assert path in doc["paths"], path
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert method.lower() in doc["paths"][path], f"{method} {path}"
    for path in ("/healthz", "/metrics", "/openapi.json"):
        assert doc["paths"][path]["get"]["security"] == []


def test_openapi_fields_match_validation_and_serialization(alice, api_settings):
    schemas = document()["components"]["schemas"]
    assert list(schemas["JobCreate"]["properties"]) == list(JOB_FIELDS)
    assert schemas["JobCreate"]["required"] == list(REQUIRED_FIELDS)
    assert set(schemas["JobPatch"]["properties"]) == set(JOB_FIELDS)
    assert set(schemas["WebhookTarget"]["properties"]) == set(WEBHOOK_FIELDS)
    assert set(schemas["QueueTarget"]["properties"]) == set(QUEUE_FIELDS)
    assert set(schemas["Limits"]["properties"]) == set(LIMITS_FIELDS)
    job = alice.create()
    assert set(schemas["Job"]["properties"]) == set(job) == set(schemas["Job"]["required"])
    run = insert_run(api_settings, job)
    assert set(schemas["Run"]["properties"]) == set(run_json(run)) == set(schemas["Run"]["required"])
    [dead_letter] = alice.get("/dead-letters").get_json()["items"]
    assert (
        set(schemas["DeadLetter"]["properties"]) == set(dead_letter) == set(schemas["DeadLetter"]["required"])
    )
    assert set(job_json(job_row(api_settings, job["id"]))) == set(job)


def test_every_documented_error_status_has_a_problem_schema():
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, answer in operation["responses"].items():
                if status.startswith("4"):
                    assert "application/problem+json" in answer["content"], f"{method} {path} {status}"


# The names docs/api.md ("Metrics") promises, on the API's /metrics and a worker's port.
DOCUMENTED_METRICS = (
    "punctual_runs_started_total",
    "punctual_runs_total",
    "punctual_start_lateness_seconds",
    "punctual_claim_batch_size",
    "punctual_claims_total",
    "punctual_leases_expired_total",
    "punctual_dispatch_messages_total",
    "punctual_stale_completions_total",
    "punctual_dead_letters_total",
    "punctual_jobs",
    "punctual_dead_letter_runs",
    "punctual_backlog_jobs",
    "punctual_backlog_age_seconds",
    "punctual_polls_total",
)


def test_metrics_declare_every_documented_name(api_settings):
    text = create_app(api_settings).test_client().get("/metrics").get_data(as_text=True)
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert set(DOCUMENTED_METRICS) <= declared, set(DOCUMENTED_METRICS) - declared


def test_the_backlog_counts_due_jobs_per_shard_and_ages_the_oldest(api_settings, alice):
    from app.core.timefmt import format_instant, utcnow

    app = create_app(api_settings)
    job = alice.create(schedule={"run_at": format_instant(utcnow())})
    shard = job_row(api_settings, job["id"])["shard"]
    text = app.test_client().get("/metrics").get_data(as_text=True)
    backlog = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("punctual_backlog_jobs{")
    }
    assert sorted(backlog, key=int) == [str(s) for s in range(api_settings.shards)]
    assert backlog[str(shard)] >= 1
    age = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("punctual_backlog_age_seconds{")
    }
    assert sorted(age, key=int) == sorted(backlog, key=int)
    assert age[str(shard)] > 0  # due since the create, a moment ago
    assert all(age[s] == 0 for s, count in backlog.items() if count == 0)
