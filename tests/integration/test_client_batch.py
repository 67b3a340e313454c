"""Batch create from the client side: the SDK's `create_jobs` and `punctual jobs create --from-file`,
against the real app on a real HTTP server."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from app.cli import main
from punctual_client import BatchResult, Client, ConflictError, Job, ValidationError
from tests.integration.api_fixtures import WEBHOOK, job_body
from tests.integration.test_api_batch import owner_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def client(live_server, alice):
    with Client(live_server, alice.api_key) as sdk:
        yield sdk


def test_create_jobs_answers_each_job_typed(client):
    results = client.create_jobs(
        [
            {**job_body(name="a"), "idempotency_key": "a"},
            {"name": "b", "target": WEBHOOK},
            {**job_body(name="c"), "idempotency_key": "a"},
            {**job_body(name="a"), "idempotency_key": "a"},
        ]
    )
    assert [r.status for r in results] == [201, 422, 409, 200]
    assert all(isinstance(r, BatchResult) for r in results)
    assert isinstance(results[0].job, Job) and results[0].created and results[0].ok
    assert results[0].error is None
    assert isinstance(results[1].error, ValidationError) and not results[1].ok and results[1].job is None
    assert [e.field for e in results[1].error.errors] == ["schedule"]
    assert isinstance(results[2].error, ConflictError)
    assert results[3].job.id == results[0].job.id and results[3].ok and not results[3].created


def test_create_jobs_sends_more_than_a_thousand_in_several_requests(client, api_settings, alice):
    results = client.create_jobs(job_body(name=f"n{i}") for i in range(2345))
    assert len(results) == 2345 and {r.status for r in results} == {201}
    assert [r.job.name for r in results] == [f"n{i}" for i in range(2345)]
    assert len(owner_rows(api_settings, alice.owner)) == 2345


@pytest.fixture
def punctual(live_server, alice):
    runner = CliRunner()
    env = {"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": alice.api_key}

    def run(*args, code=0):
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result

    return run


def test_create_from_a_jsonl_file(punctual, tmp_path, api_settings, alice):
    lines = [json.dumps({**job_body(name=f"f{i}"), "idempotency_key": f"f{i}"}) for i in range(1500)]
    lines.insert(3, "")  # blank lines are skipped
    lines.insert(10, json.dumps({"name": "broken"}))
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = punctual("jobs", "create", "--from-file", str(path), "--json", code=1)  # one job failed
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == 1501
    assert [a["line"] for a in answers][:12] == [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    broken = next(a for a in answers if a["status"] == 422)
    assert broken["line"] == 11
    assert {e["field"] for e in broken["problem"]["errors"]} == {"target", "schedule"}
    assert sum(a["status"] == 201 for a in answers) == 1500
    assert len(owner_rows(api_settings, alice.owner)) == 1500

    again = punctual("jobs", "create", "--from-file", str(path), code=1)  # text: one line per job
    text = again.stdout.splitlines()
    assert len(text) == 1501 and sum(" 200 " in line for line in text) == 1500
    assert "created 0, existing 1500, failed 1" in again.stderr


def test_from_file_stops_at_a_line_that_is_not_json_before_sending_its_batch(
    punctual, tmp_path, api_settings, alice
):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(job_body()) + "\n{not json\n")
    result = punctual("jobs", "create", "--from-file", str(path), code=2)
    assert "line 2" in result.output
    assert owner_rows(api_settings, alice.owner) == []


def test_from_file_reads_stdin(punctual, live_server, alice):
    runner = CliRunner()
    result = runner.invoke(
        main,
        ["jobs", "create", "--from-file", "-", "--json"],
        input=json.dumps(job_body(name="piped")) + "\n",
        env={"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": alice.api_key},
    )
    assert result.exit_code == 0, result.output
    [answer] = [json.loads(line) for line in result.stdout.splitlines()]
    assert answer["status"] == 201 and answer["job"]["name"] == "piped"
