"""/jobs against real Postgres (two physical shards): create, get, patch, cancel,
pause, resume, trigger, with every status docs/api.md gives them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.api import create_app
from app.core.timefmt import format_instant, parse_instant, utcnow
from tests.integration.api_fixtures import insert_run, job_body, job_row, run_rows, set_job

pytestmark = pytest.mark.integration


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- create ------------------------------------------------------------------------


def test_create_answers_201_the_job_and_its_location(alice):
    before = utcnow()
    response = alice.post("/jobs", json=job_body(payload={"any": ["json", 1]}))
    assert response.status_code == 201
    job = response.get_json()
    assert response.headers["Location"] == f"/jobs/{job['id']}"
    assert set(job) == {
        "id",
        "key",
        "name",
        "state",
        "next_run_at",
        "target",
        "payload",
        "schedule",
        "retry",
        "misfire",
        "dst",
        "jitter_s",
        "overlap",
        "attempt",
        "labels",
        "created_at",
        "updated_at",
    }
    assert job["state"] == "scheduled" and job["attempt"] == 0 and job["payload"] == {"any": ["json", 1]}
    assert job["schedule"] == {"cron": "0 0 * * *", "timezone": "Europe/Berlin"}
    assert job["retry"] == {"max_attempts": 5, "backoff_s": 10, "max_backoff_s": 3600}
    assert job["dst"] == {"gap": "shift", "overlap": "once"} and job["misfire"] == "run_once"
    next_run = parse_instant(job["next_run_at"])
    assert (
        next_run > before and next_run.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin")).hour == 0
    )
    assert job["created_at"].endswith("Z") and job["next_run_at"].endswith("Z")
    assert alice.get(f"/jobs/{job['id']}").get_json() == job  # what create said is what the registry holds


def test_interval_job_fires_one_interval_after_creation_plus_jitter(alice, api_settings):
    job = alice.create(schedule={"interval_s": 60}, jitter_s=30)
    created, next_run = parse_instant(job["created_at"]), parse_instant(job["next_run_at"])
    assert timedelta(seconds=60) <= next_run - created < timedelta(seconds=90)
    assert job_row(api_settings, job["id"])["nominal_at"] == created + timedelta(seconds=60)


def test_a_one_off_in_the_past_within_the_misfire_grace_is_due_at_once(alice):
    # (beyond the grace it is refused: tests/integration/test_api_outages.py)
    past = (utcnow() - timedelta(seconds=10)).replace(microsecond=0)
    job = alice.create(schedule={"run_at": past.astimezone(timezone(timedelta(hours=1))).isoformat()})
    assert job["schedule"] == {"run_at": format_instant(past)}
    assert job["next_run_at"] == format_instant(past)


def test_a_recurring_schedule_with_no_occurrence_left_is_422(alice):
    response = alice.post(
        "/jobs", json=job_body(schedule={"interval_s": 60, "end_at": "2020-01-01T00:00:00Z"})
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.get_json()["errors"]] == ["schedule"]


def test_a_queue_job(alice):
    job = alice.create(target={"type": "queue", "topic": "reports.daily", "limits": {"rate_per_s": 5}})
    assert job["target"] == {"type": "queue", "topic": "reports.daily", "limits": {"rate_per_s": 5}}


def test_create_lists_every_invalid_field(alice):
    response = alice.post(
        "/jobs",
        json={
            "name": "x" * 201,
            "target": {"type": "webhook", "url": "file:///etc/passwd"},
            "schedule": {"cron": "* * *", "timezone": "Mars/Olympus"},
            "retry": {"max_attempts": 101},
            "jitter_s": -1,
            "extra": 1,
        },
    )
    assert response.status_code == 422
    problem = response.get_json()
    assert response.mimetype == "application/problem+json"
    assert problem["status"] == 422 and problem["title"] and problem["detail"] and problem["type"]
    assert {e["field"] for e in problem["errors"]} == {
        "name",
        "target.url",
        "schedule.cron",
        "schedule.timezone",
        "retry.max_attempts",
        "jitter_s",
        "extra",
    }


def test_naive_times_are_refused(alice):
    response = alice.post("/jobs", json=job_body(schedule={"run_at": "2026-12-01T00:00:00"}))
    assert response.status_code == 422
    assert response.get_json()["errors"][0]["field"] == "schedule.run_at"


def test_private_targets_are_422_unless_the_server_allows_them(api_settings, alice):
    strict = create_app(api_settings.__class__(**{**api_settings.__dict__, "allow_private_targets": False}))
    client = strict.test_client()
    headers = {"Authorization": f"Bearer {alice.api_key}"}
    for url in (
        "http://127.0.0.1:9/hook",
        "http://10.0.0.7/",
        "http://169.254.169.254/latest",
        "http://[::ffff:127.0.0.1]/",
    ):
        response = client.post(
            "/jobs", json=job_body(target={"type": "webhook", "url": url}), headers=headers
        )
        assert response.status_code == 422, url
        assert response.get_json()["errors"][0]["field"] == "target.url"
    assert alice.post("/jobs", json=job_body()).status_code == 201  # the permissive server takes 127.0.0.1


# --- idempotency ---------------------------------------------------------------------


def test_same_key_same_body_answers_200_with_the_same_job(alice):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = alice.post("/jobs", json=job_body(), headers=key)
    again = alice.post("/jobs", json=job_body(), headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.get_json() == first.get_json()
    assert (
        again.headers["Idempotent-Replayed"] == "true"
        and again.headers["Location"] == first.headers["Location"]
    )


def test_same_key_equal_json_counts_as_the_same_body(alice):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    assert alice.post("/jobs", json=job_body(jitter_s=5), headers=key).status_code == 201
    reordered = {"jitter_s": 5.0, **dict(reversed(list(job_body().items())))}
    assert alice.post("/jobs", json=reordered, headers=key).status_code == 200


def test_same_key_different_body_is_409(alice):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    assert alice.post("/jobs", json=job_body(), headers=key).status_code == 201
    response = alice.post("/jobs", json=job_body(name="other"), headers=key)
    assert response.status_code == 409
    assert "Idempotency-Key" in response.get_json()["detail"]


def test_keys_are_scoped_to_the_owner(alice, bob):
    key = {"Idempotency-Key": "shared-key"}
    a = alice.post("/jobs", json=job_body(), headers=key).get_json()
    b = bob.post("/jobs", json=job_body(name="bob's"), headers=key)
    assert b.status_code == 201 and b.get_json()["id"] != a["id"]


def test_a_repeat_whose_body_no_longer_validates_still_answers_the_job(api_settings, alice):
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = alice.post("/jobs", json=job_body(), headers=key).get_json()
    strict = create_app(api_settings.__class__(**{**api_settings.__dict__, "allow_private_targets": False}))
    again = strict.test_client().post(
        "/jobs", json=job_body(), headers={**key, "Authorization": f"Bearer {alice.api_key}"}
    )
    assert again.status_code == 200 and again.get_json()["id"] == first["id"]


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_empty_or_overlong_key_is_422(alice, key):
    response = alice.post("/jobs", json=job_body(), headers={"Idempotency-Key": key})
    assert response.status_code == 422
    assert response.get_json()["errors"] == [
        {"field": "Idempotency-Key", "message": "must be 1 to 255 characters"}
    ]


def test_a_255_character_key_is_fine(alice):
    assert alice.post("/jobs", json=job_body(), headers={"Idempotency-Key": "k" * 255}).status_code == 201


# --- get -------------------------------------------------------------------------------


def test_get_unknown_or_malformed_ids_are_404(alice):
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        response = alice.get(f"/jobs/{job_id}")
        assert response.status_code == 404
        assert response.mimetype == "application/problem+json"


# --- patch ------------------------------------------------------------------------------


def test_patch_replaces_fields_and_recomputes_next_run_at(alice, api_settings):
    job = alice.create()
    response = alice.patch(f"/jobs/{job['id']}", json={"schedule": {"interval_s": 120}, "name": "renamed"})
    assert response.status_code == 200
    patched = response.get_json()
    assert patched["name"] == "renamed" and patched["schedule"] == {"interval_s": 120}
    assert patched["target"] == job["target"] and patched["created_at"] == job["created_at"]
    # the interval grid starts at creation: the first point after now
    created, next_run = parse_instant(job["created_at"]), parse_instant(patched["next_run_at"])
    assert (next_run - created) % timedelta(seconds=120) == timedelta(0)
    assert utcnow() < next_run <= utcnow() + timedelta(seconds=120)
    assert patched["updated_at"] > job["updated_at"]


def test_patch_schedule_is_replaced_whole_and_omitted_subfields_take_defaults(alice):
    job = alice.create(
        schedule={"cron": "0 9 * * *", "timezone": "Asia/Tokyo", "end_at": "2099-01-01T00:00:00Z"}
    )
    patched = alice.patch(f"/jobs/{job['id']}", json={"schedule": {"cron": "0 10 * * *"}}).get_json()
    assert patched["schedule"] == {"cron": "0 10 * * *", "timezone": "UTC"}
    assert parse_instant(patched["next_run_at"]).hour == 10


def test_patch_of_other_fields_keeps_the_cursor(alice, api_settings):
    job = alice.create(schedule={"interval_s": 3600})
    set_job(api_settings, job["id"], attempt=2, misfire_exempt=True)  # a retry in progress
    patched = alice.patch(
        f"/jobs/{job['id']}", json={"payload": {"v": 2}, "retry": {"max_attempts": 9}}
    ).get_json()
    assert patched["next_run_at"] == job["next_run_at"] and patched["attempt"] == 2
    assert patched["retry"] == {"max_attempts": 9, "backoff_s": 10, "max_backoff_s": 3600}


def _in_flight(api_settings, job: dict, token: uuid.UUID) -> None:
    """The job's run started under `token`: the job holds the lease, the run row is `running`."""
    set_job(
        api_settings,
        job["id"],
        state="running",
        lease_token=token,
        leased_until=utcnow() + timedelta(seconds=60),
    )
    insert_run(
        api_settings,
        job,
        attempt=1,
        state="running",
        lease_token=token,
        leased_until=utcnow() + timedelta(seconds=20),
        finished_at=None,
        status_code=None,
        error=None,
    )


def test_patch_while_running_leaves_the_cursor_to_the_completion(alice, api_settings):
    job = alice.create(schedule={"interval_s": 3600})
    _in_flight(api_settings, job, uuid.uuid4())
    patched = alice.patch(f"/jobs/{job['id']}", json={"schedule": {"interval_s": 60}}).get_json()
    assert patched["state"] == "running" and patched["next_run_at"] == job["next_run_at"]
    assert patched["schedule"] == {"interval_s": 60}


def test_patch_to_a_schedule_with_nothing_left_completes_the_job(alice):
    job = alice.create(schedule={"interval_s": 60})
    patched = alice.patch(
        f"/jobs/{job['id']}", json={"schedule": {"interval_s": 60, "end_at": "2021-01-01T00:00:00Z"}}
    )
    assert patched.status_code == 200
    assert patched.get_json()["state"] == "completed" and patched.get_json()["next_run_at"] is None


def test_patch_a_paused_job_stays_paused(alice):
    job = alice.create()
    alice.post(f"/jobs/{job['id']}/pause")
    patched = alice.patch(f"/jobs/{job['id']}", json={"jitter_s": 10}).get_json()
    assert patched["state"] == "paused" and patched["jitter_s"] == 10


@pytest.mark.parametrize("state", ["cancelled", "completed", "dead"])
def test_patch_of_a_finished_job_is_409(alice, api_settings, state):
    job = alice.create()
    set_job(api_settings, job["id"], state=state)
    response = alice.patch(f"/jobs/{job['id']}", json={"name": "late"})
    assert response.status_code == 409
    assert response.mimetype == "application/problem+json"


def test_patch_invalid_fields_is_422_with_every_field(alice):
    job = alice.create()
    response = alice.patch(f"/jobs/{job['id']}", json={"name": "", "id": "x", "target": {"type": "queue"}})
    assert response.status_code == 422
    assert {e["field"] for e in response.get_json()["errors"]} == {"name", "id", "target.topic"}


def test_patch_unknown_job_is_404(alice):
    assert alice.patch(f"/jobs/{uuid.uuid4()}", json={"name": "x"}).status_code == 404


# --- cancel ------------------------------------------------------------------------------


def test_cancel_answers_the_cancelled_job_and_repeating_it_is_fine(alice, api_settings):
    job = alice.create()
    trigger = alice.post(f"/jobs/{job['id']}/trigger").get_json()
    response = alice.delete(f"/jobs/{job['id']}")
    assert response.status_code == 200
    cancelled = response.get_json()
    assert cancelled["state"] == "cancelled" and cancelled["next_run_at"] is None
    assert alice.delete(f"/jobs/{job['id']}").status_code == 200
    runs = run_rows(api_settings, job["id"])
    assert [(str(r["run_id"]), r["state"], r["error"]) for r in runs] == [
        (trigger["id"], "failed", "job cancelled")
    ]


def test_cancel_leaves_a_running_run_alone(alice, api_settings):
    job = alice.create()
    run = alice.post(f"/jobs/{job['id']}/trigger").get_json()
    from app.registry.schema import runs
    from tests.integration.api_fixtures import engine_of

    engine, _ = engine_of(api_settings, job["id"])
    with engine.begin() as conn:
        conn.execute(runs.update().where(runs.c.run_id == uuid.UUID(run["id"])).values(state="running"))
    alice.delete(f"/jobs/{job['id']}")
    assert run_rows(api_settings, job["id"])[0]["state"] == "running"


@pytest.mark.parametrize("state", ["completed", "dead"])
def test_cancel_of_a_completed_or_dead_job_is_409(alice, api_settings, state):
    job = alice.create()
    set_job(api_settings, job["id"], state=state)
    assert alice.delete(f"/jobs/{job['id']}").status_code == 409


# --- pause, resume ----------------------------------------------------------------------


def test_pause_and_resume(alice):
    job = alice.create()
    paused = alice.post(f"/jobs/{job['id']}/pause")
    assert paused.status_code == 200 and paused.get_json()["state"] == "paused"
    assert alice.post(f"/jobs/{job['id']}/pause").get_json()["state"] == "paused"  # repeating is fine
    resumed = alice.post(f"/jobs/{job['id']}/resume")
    assert resumed.status_code == 200 and resumed.get_json()["state"] == "scheduled"
    assert resumed.get_json()["next_run_at"] == job["next_run_at"]  # the claim applies the misfire policy
    assert alice.post(f"/jobs/{job['id']}/resume").get_json()["state"] == "scheduled"


def test_pause_while_running_keeps_the_lease_and_resume_returns_to_running(alice, api_settings):
    job = alice.create()
    token = uuid.uuid4()
    _in_flight(api_settings, job, token)
    assert alice.post(f"/jobs/{job['id']}/pause").get_json()["state"] == "paused"
    assert job_row(api_settings, job["id"])["lease_token"] == token
    assert alice.post(f"/jobs/{job['id']}/resume").get_json()["state"] == "running"


@pytest.mark.parametrize("verb", ["pause", "resume"])
@pytest.mark.parametrize("state", ["cancelled", "completed", "dead"])
def test_pause_or_resume_of_a_finished_job_is_409(alice, api_settings, verb, state):
    job = alice.create()
    set_job(api_settings, job["id"], state=state)
    assert alice.post(f"/jobs/{job['id']}/{verb}").status_code == 409


# --- trigger ------------------------------------------------------------------------------


def test_trigger_answers_202_with_a_claimed_run_for_the_relay(alice, api_settings):
    job = alice.create()
    before = utcnow()
    response = alice.post(f"/jobs/{job['id']}/trigger")
    assert response.status_code == 202
    run = response.get_json()
    assert set(run) == {
        "id",
        "job_id",
        "origin",
        "scheduled_for",
        "attempt",
        "state",
        "started_at",
        "finished_at",
        "lateness_ms",
        "status_code",
        "error",
    }
    assert (run["job_id"], run["attempt"], run["state"]) == (job["id"], 1, "claimed")
    scheduled_for = parse_instant(run["scheduled_for"])
    assert (
        scheduled_for.microsecond % 1000 == 0
        and before - timedelta(milliseconds=1) <= scheduled_for <= utcnow()
    )
    [row] = run_rows(api_settings, job["id"])
    assert row["origin"] == "trigger" and row["published"] is False and row["due_at"] <= utcnow()
    assert row["lease_token"] is not None and row["leased_until"] > utcnow()
    assert row["target"] == job["target"] and row["retry"] == job["retry"]
    after = alice.get(f"/jobs/{job['id']}").get_json()
    assert (after["state"], after["next_run_at"]) == (job["state"], job["next_run_at"])


@pytest.mark.parametrize("state", ["paused", "running"])
def test_trigger_works_on_paused_and_running_jobs(alice, api_settings, state):
    job = alice.create()
    set_job(api_settings, job["id"], state=state)
    assert alice.post(f"/jobs/{job['id']}/trigger").status_code == 202
    assert alice.get(f"/jobs/{job['id']}").get_json()["state"] == state


@pytest.mark.parametrize("state", ["cancelled", "completed", "dead"])
def test_trigger_of_a_finished_job_is_409(alice, api_settings, state):
    job = alice.create()
    set_job(api_settings, job["id"], state=state)
    assert alice.post(f"/jobs/{job['id']}/trigger").status_code == 409
    assert run_rows(api_settings, job["id"]) == []


def test_jobs_sharing_a_cron_get_the_same_first_fire_and_it_moves_with_now(alice):
    from app.core.schedules import DstPolicy, Schedule
    from app.services import jobs

    a = alice.create(schedule={"cron": "*/5 * * * *"})
    b = alice.create(schedule={"cron": "*/5 * * * *"})
    assert a["next_run_at"] == b["next_run_at"]
    schedule = Schedule(kind="cron", cron="*/5 * * * *")
    at = parse_instant(a["next_run_at"])
    # not the remembered one:
    assert jobs.first_fire_remembered(schedule, DstPolicy(), at, at) == at + timedelta(minutes=5)
    assert jobs.first_fire_remembered(schedule, DstPolicy(), at - timedelta(seconds=1), at) == at


def test_the_embedded_sqlite_registry_creates_idempotently_too(tmp_path):
    """Postgres takes the driver-level INSERT; the SQLite of `punctual dev` goes through Core."""
    from app.registry.engines import registry_for
    from app.registry.migrate import migrate_all
    from app.services.owners import create_key
    from app.settings import Settings

    settings = Settings.from_env({"PUNCTUAL_DATA_DIR": str(tmp_path), "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1"})
    migrate_all(settings.database_urls, shards=settings.shards)
    registry = registry_for(settings)
    try:
        headers = {"Authorization": f"Bearer {create_key(registry, 'solo').api_key}", "Idempotency-Key": "k1"}
        client = create_app(settings).test_client()
        first = client.post("/jobs", json=job_body(), headers=headers)
        again = client.post("/jobs", json=job_body(), headers=headers)
        other = client.post("/jobs", json=job_body(name="else"), headers=headers)
        assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
        assert again.get_json() == first.get_json()
        assert (
            client.post(
                "/jobs", json=job_body(), headers={"Authorization": headers["Authorization"]}
            ).status_code
            == 201
        )
    finally:
        registry.dispose()


def test_a_named_limits_key_takes_the_limits_of_the_job_last_created_or_updated_with_it(
    alice, bob, api_settings
):
    from app.limits.keys import LimitKeyDirectory
    from app.registry.engines import registry_for

    def limits_of(owner):
        return (
            LimitKeyDirectory(registry_for(api_settings), ttl_s=0)
            .lookup_many([(owner, "billing-api")])
            .get((owner, "billing-api"))
        )

    target = {
        "type": "webhook",
        "url": "http://127.0.0.1:9/hook",
        "limits": {"key": "billing-api", "rate_per_s": 50},
    }
    first = alice.create(target=target)
    assert limits_of(alice.owner) == (50.0, None)
    alice.create(target={**target, "limits": {"key": "billing-api", "max_concurrency": 3}})
    assert limits_of(alice.owner) == (None, 3)
    alice.patch(
        f"/jobs/{first['id']}", json={"target": {**target, "limits": {"key": "billing-api", "rate_per_s": 7}}}
    )
    assert limits_of(alice.owner) == (7.0, None)
    assert limits_of(bob.owner) is None  # scoped to the owner
    alice.patch(f"/jobs/{first['id']}", json={"name": "renamed"})  # no target: the key keeps its limits
    assert limits_of(alice.owner) == (7.0, None)
