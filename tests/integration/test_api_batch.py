"""POST /jobs/batch against the real app on two Postgres shards (and the embedded SQLite)."""

from __future__ import annotations

import threading
import uuid

import pytest
import requests
import sqlalchemy as sa

from app.api import create_app
from app.registry.engines import registry_for
from app.registry.migrate import migrate_all
from app.registry.schema import jobs, limit_keys
from app.services.owners import create_key
from app.settings import Settings
from tests.integration.api_fixtures import WEBHOOK, job_body, job_row

pytestmark = pytest.mark.integration
MISSING_DATABASE = "postgresql://root@127.0.0.1:5432/punctual_no_such_db_"


def batch(caller, jobs_, **kw):
    return caller.post("/jobs/batch", json={"jobs": jobs_}, **kw)


def owner_rows(settings, owner) -> list[dict]:
    rows = []
    for engine in registry_for(settings).engines:
        with engine.connect() as conn:
            rows += [dict(r) for r in conn.execute(sa.select(jobs).where(jobs.c.owner == owner)).mappings()]
    return rows


def test_each_job_gets_its_own_answer_in_request_order(alice, api_settings):
    replayed = alice.post(
        "/jobs", json=job_body(name="earlier"), headers={"Idempotency-Key": "k-earlier"}
    ).get_json()
    response = batch(
        alice,
        [
            job_body(name="plain"),
            {"name": "", "target": {"type": "webhook"}, "schedule": {"cron": "61 * * * *"}, "bogus": 1},
            {**job_body(name="keyed"), "idempotency_key": "k-new"},
            {**job_body(name="earlier"), "idempotency_key": "k-earlier"},
            {**job_body(name="other body"), "idempotency_key": "k-earlier"},
            "not an object",
        ],
    )
    assert response.status_code == 200 and response.mimetype == "application/json"
    items = response.get_json()["items"]
    assert [item["status"] for item in items] == [201, 422, 201, 200, 409, 422]
    assert items[0]["job"]["name"] == "plain" and items[0]["job"]["state"] == "scheduled"
    problem = items[1]["problem"]
    assert problem["status"] == 422 and problem["type"].endswith("invalid-fields")
    assert {e["field"] for e in problem["errors"]} >= {"name", "target.url", "schedule.cron", "bogus"}
    assert items[3]["job"]["id"] == replayed["id"]
    assert items[4]["problem"]["type"].endswith("idempotency-conflict")
    assert items[5]["problem"]["errors"] == [{"field": "body", "message": "must be a JSON object"}]
    assert "job" not in items[1] and "problem" not in items[0]
    names = sorted(row["name"] for row in owner_rows(api_settings, alice.owner))
    assert names == ["earlier", "keyed", "plain"]


def test_a_batch_job_is_the_row_a_single_create_writes(alice, api_settings):
    body = job_body(
        name="same",
        payload={"n": 1},
        retry={"max_attempts": 2},
        jitter_s=7,
        target={**WEBHOOK, "headers": {"X-A": "1"}, "limits": {"key": "k", "max_concurrency": 3}},
    )
    single = alice.post("/jobs", json=body, headers={"Idempotency-Key": "one"}).get_json()
    [item] = batch(alice, [{**body, "idempotency_key": "two"}]).get_json()["items"]
    assert item["status"] == 201
    varying = {"id", "next_run_at", "created_at", "updated_at"}
    assert {k: v for k, v in item["job"].items() if k not in varying} == {
        k: v for k, v in single.items() if k not in varying
    }
    assert alice.get(f"/jobs/{item['job']['id']}").get_json() == item["job"]
    ignore = {"job_id", "shard", "next_run_at", "idempotency_key", "created_at", "updated_at"}
    one, two = job_row(api_settings, single["id"]), job_row(api_settings, item["job"]["id"])
    assert {k: v for k, v in one.items() if k not in ignore} == {
        k: v for k, v in two.items() if k not in ignore
    }
    assert two["idempotency_key"] == "two"


def test_keys_within_one_batch_answer_as_if_sent_one_after_another(alice, api_settings):
    invalid = {**job_body(name="x", schedule={"cron": "bad"}), "idempotency_key": "dup"}
    first = {**job_body(name="x"), "idempotency_key": "dup"}
    different = {**job_body(name="y"), "idempotency_key": "dup"}
    items = batch(alice, [invalid, first, first, different]).get_json()["items"]
    assert [item["status"] for item in items] == [422, 201, 200, 409]
    assert items[1]["job"]["id"] == items[2]["job"]["id"]
    assert len(owner_rows(api_settings, alice.owner)) == 1


def test_a_repeated_batch_replays_every_job(alice, api_settings):
    body = [{**job_body(name=f"r{i}"), "idempotency_key": f"r{i}"} for i in range(50)]
    first = batch(alice, body).get_json()["items"]
    again = batch(alice, body).get_json()["items"]
    assert {item["status"] for item in first} == {201} and {item["status"] for item in again} == {200}
    assert [item["job"]["id"] for item in first] == [item["job"]["id"] for item in again]
    assert len(owner_rows(api_settings, alice.owner)) == 50


def test_a_thousand_jobs_land_on_every_shard(alice, api_settings):
    items = batch(alice, [job_body(name=f"n{i}", payload={"i": i}) for i in range(1000)]).get_json()["items"]
    assert [item["status"] for item in items] == [201] * 1000
    assert [item["job"]["payload"] for item in items] == [{"i": i} for i in range(1000)]
    rows = owner_rows(api_settings, alice.owner)
    assert len(rows) == 1000 and len({row["shard"] for row in rows}) == api_settings.shards
    assert {str(row["job_id"]) for row in rows} == {item["job"]["id"] for item in items}


def test_the_envelope_is_checked_before_any_job(alice, api_settings):
    too_many = batch(alice, [job_body()] * 1001)
    assert too_many.status_code == 422 and too_many.get_json()["errors"][0]["field"] == "jobs"
    bad = alice.post("/jobs/batch", json={"jobs": {}, "extra": 1})
    assert bad.status_code == 422 and {e["field"] for e in bad.get_json()["errors"]} == {"jobs", "extra"}
    assert alice.post("/jobs/batch", json=[job_body()]).status_code == 422
    assert alice.post("/jobs/batch", data="{}", content_type="text/plain").status_code == 415
    assert alice.client.post("/jobs/batch", json={"jobs": [job_body()]}).status_code == 401
    assert batch(alice, []).get_json() == {"items": []}
    assert owner_rows(api_settings, alice.owner) == []


def test_a_job_over_64_kib_is_refused_alone(alice, api_settings):
    big = job_body(name="big", payload={"blob": "x" * (64 * 1024)})
    response = batch(alice, [job_body(name="small"), big, job_body(name="small too")])
    assert response.status_code == 200  # the whole body may exceed what one create allows
    items = response.get_json()["items"]
    assert [item["status"] for item in items] == [201, 413, 201]
    assert items[1]["problem"]["status"] == 413
    assert len(owner_rows(api_settings, alice.owner)) == 2


def test_a_named_limits_key_takes_the_last_jobs_limits(alice, api_settings):
    def target(cap):
        return {**WEBHOOK, "limits": {"key": "shared", "max_concurrency": cap}}

    batch(alice, [job_body(target=target(1)), job_body(target=target(2)), job_body(target=target(3))])
    with registry_for(api_settings).home.connect() as conn:
        query = sa.select(limit_keys.c.max_concurrency).where(
            limit_keys.c.owner == alice.owner, limit_keys.c.name == "shared"
        )
        cap = conn.execute(query).scalar_one()
    assert cap == 3


def test_keys_are_scoped_to_their_owner(alice, bob):
    [mine] = batch(alice, [{**job_body(), "idempotency_key": "shared-key"}]).get_json()["items"]
    [theirs] = batch(bob, [{**job_body(name="other"), "idempotency_key": "shared-key"}]).get_json()["items"]
    assert mine["status"] == theirs["status"] == 201 and mine["job"]["id"] != theirs["job"]["id"]


def test_concurrent_identical_batches_make_each_job_once(live_server, alice, api_settings):
    body = {"jobs": [{**job_body(name=f"c{i}"), "idempotency_key": f"c{i}"} for i in range(200)]}
    barrier = threading.Barrier(6)
    answers: list[list[int]] = []

    def send():
        barrier.wait()
        response = requests.post(
            f"{live_server}/jobs/batch",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {alice.api_key}"},
        )
        answers.append([item["status"] for item in response.json()["items"]])

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 6
    for i in range(200):
        assert sorted(answer[i] for answer in answers) == [200] * 5 + [201]
    assert len(owner_rows(api_settings, alice.owner)) == 200


def test_a_dsn_that_fails_answers_its_own_jobs_503_and_the_others_are_created(pg_dsns):
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": f"{pg_dsns[0]},{MISSING_DATABASE}{uuid.uuid4().hex[:6]}",
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DB_POOL_SIZE": "2",
        }
    )
    key = create_key(registry_for(settings), f"split-{uuid.uuid4().hex[:6]}")
    client = create_app(settings).test_client()
    response = client.post(
        "/jobs/batch",
        json={"jobs": [job_body(name=f"s{i}") for i in range(40)]},
        headers={"Authorization": f"Bearer {key.api_key}"},
    )
    items = response.get_json()["items"]
    assert response.status_code == 200
    assert {item["status"] for item in items} == {201, 503}
    for item in items:
        if item["status"] == 503:
            assert item["problem"]["status"] == 503 and "retry" in item["problem"]["detail"]
    created = [item["job"]["id"] for item in items if item["status"] == 201]
    with registry_for(settings).engines[0].connect() as conn:
        count = sa.select(sa.func.count()).select_from(jobs).where(jobs.c.owner == key.owner)
        stored = conn.execute(count).scalar()
    assert stored == len(created)
    registry_for(settings).dispose()


def test_the_embedded_sqlite_registry_takes_batches_too(tmp_path):
    settings = Settings.from_env(
        {
            "PUNCTUAL_DATABASE_URLS": f"sqlite:///{tmp_path}/registry.sqlite3",
            "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
            "PUNCTUAL_DEV_MODE": "1",
        }
    )
    migrate_all(settings.database_urls, shards=settings.shards)
    key = create_key(registry_for(settings), "dev")
    client = create_app(settings).test_client()
    headers = {"Authorization": f"Bearer {key.api_key}"}
    body = {"jobs": [{**job_body(name="a"), "idempotency_key": "a"}, job_body(name="b"), {"name": 1}]}
    first = client.post("/jobs/batch", json=body, headers=headers).get_json()["items"]
    again = client.post("/jobs/batch", json=body, headers=headers).get_json()["items"]
    assert [i["status"] for i in first] == [201, 201, 422] and [i["status"] for i in again] == [200, 201, 422]
    assert again[0]["job"]["id"] == first[0]["job"]["id"]
    registry_for(settings).dispose()


def test_a_past_run_at_is_refused_per_job_as_post_jobs_refuses_it(alice):
    from datetime import timedelta

    from app.core.timefmt import format_instant, utcnow

    past = {**job_body(name="late"), "schedule": {"run_at": format_instant(utcnow() - timedelta(hours=1))}}
    single = alice.post("/jobs", json=past)
    [late, ok] = batch(alice, [past, job_body(name="fine")]).get_json()["items"]
    assert single.status_code == 422 and late["status"] == 422 and ok["status"] == 201
    assert late["problem"]["errors"] == single.get_json()["errors"]
