"""`punctual jobs ...` and `punctual preview` against the real app on a real HTTP server;
`punctual api` under gunicorn with graceful shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import click
import pytest
import requests
from click.testing import CliRunner

from app.cli import main
from app.registry.schema import jobs as jobs_table
from tests.integration.api_fixtures import engine_of, insert_run

pytestmark = pytest.mark.integration


@pytest.fixture
def punctual(live_server, alice):
    runner = CliRunner()
    env = {"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": alice.api_key}

    def run(*args, ok=True):
        result = runner.invoke(main, list(args), env=env, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output + (result.stderr if hasattr(result, "stderr") else "")
        return result

    return run


def create(punctual, *extra) -> dict:
    result = punctual(
        "jobs",
        "create",
        "--name",
        "cli-job",
        "--cron",
        "0 0 * * *",
        "--timezone",
        "Europe/Berlin",
        "--target-url",
        "http://127.0.0.1:9/hook",
        "--header",
        "X-Team: billing",
        "--payload",
        '{"a": 1}',
        "--json",
        *extra,
    )
    return json.loads(result.stdout)


def test_create_prints_the_job_as_json(punctual):
    job = create(punctual, "--max-attempts", "3", "--jitter-s", "5", "--gap", "skip")
    assert job["name"] == "cli-job" and job["payload"] == {"a": 1}
    assert job["target"]["headers"] == {"X-Team": "billing"}
    assert job["retry"]["max_attempts"] == 3 and job["jitter_s"] == 5 and job["dst"]["gap"] == "skip"


def test_create_from_a_body_and_a_queue_target(punctual):
    body = json.dumps(
        {
            "name": "from-body",
            "target": {"type": "queue", "topic": "reports.daily"},
            "schedule": {"interval_s": 60},
        }
    )
    job = json.loads(punctual("jobs", "create", "--body", body, "--json").stdout)
    assert job["target"] == {"type": "queue", "topic": "reports.daily"}


def test_idempotency_key(punctual):
    first = create(punctual, "--idempotency-key", "cli-key")
    assert create(punctual, "--idempotency-key", "cli-key")["id"] == first["id"]


def test_tables_by_default(punctual):
    job = create(punctual)
    table = punctual("jobs", "get", job["id"]).stdout
    header, row = table.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "STATE", "NEXT"]
    assert (
        job["id"] in row and "cron 0 0 * * * Europe/Berlin" in row and "POST http://127.0.0.1:9/hook" in row
    )
    listing = punctual("jobs", "list").stdout
    assert job["id"] in listing


def test_list_json_pages_and_all(punctual):
    ids = {create(punctual)["id"] for _ in range(3)}
    page = json.loads(punctual("jobs", "list", "--limit", "2", "--json").stdout)
    assert len(page["items"]) == 2 and page["next_cursor"]
    everything = json.loads(punctual("jobs", "list", "--all", "--limit", "1", "--json").stdout)
    assert ids <= {j["id"] for j in everything}


def test_verbs_and_runs(punctual):
    job = create(punctual)
    assert json.loads(punctual("jobs", "pause", job["id"], "--json").stdout)["state"] == "paused"
    assert json.loads(punctual("jobs", "resume", job["id"], "--json").stdout)["state"] == "scheduled"
    run = json.loads(punctual("jobs", "trigger", job["id"], "--json").stdout)
    assert run["state"] == "claimed"
    runs = json.loads(punctual("jobs", "runs", job["id"], "--json").stdout)
    assert [r["id"] for r in runs["items"]] == [run["id"]]
    assert "claimed" in punctual("jobs", "runs", job["id"]).stdout
    assert json.loads(punctual("jobs", "cancel", job["id"], "--json").stdout)["state"] == "cancelled"


def test_update_changes_only_what_is_given(punctual):
    job = create(punctual, "--max-attempts", "3", "--backoff-s", "20", "--gap", "skip")
    renamed = json.loads(punctual("jobs", "update", job["id"], "--name", "renamed", "--json").stdout)
    assert renamed["name"] == "renamed" and renamed["schedule"] == job["schedule"]
    assert renamed["target"] == job["target"] and renamed["retry"] == job["retry"]

    changed = json.loads(
        punctual(
            "jobs",
            "update",
            job["id"],
            "--max-attempts",
            "7",
            "--overlap",
            "twice",
            "--timezone",
            "UTC",
            "--method",
            "PUT",
            "--payload",
            '{"b": 2}',
            "--misfire",
            "skip",
            "--jitter-s",
            "9",
            "--json",
        ).stdout
    )
    assert changed["retry"] == {**job["retry"], "max_attempts": 7}  # backoff_s kept at 20
    assert changed["retry"]["backoff_s"] == 20
    assert changed["dst"] == {"gap": "skip", "overlap": "twice"}
    assert changed["schedule"] == {"cron": "0 0 * * *", "timezone": "UTC"}
    assert changed["target"]["method"] == "PUT" and changed["target"]["headers"] == {"X-Team": "billing"}
    assert changed["target"]["url"] == job["target"]["url"]
    assert (changed["payload"], changed["misfire"], changed["jitter_s"]) == ({"b": 2}, "skip", 9)

    every = json.loads(punctual("jobs", "update", job["id"], "--interval-s", "60", "--json").stdout)
    assert every["schedule"] == {"interval_s": 60}
    queue = json.loads(punctual("jobs", "update", job["id"], "--topic", "reports.daily", "--json").stdout)
    assert queue["target"] == {"type": "queue", "topic": "reports.daily"}
    back = json.loads(
        punctual(
            "jobs",
            "update",
            job["id"],
            "--target-url",
            "http://127.0.0.1:9/new",
            "--header",
            "X-New: 1",
            "--json",
        ).stdout
    )
    assert back["target"]["url"] == "http://127.0.0.1:9/new" and back["target"]["headers"] == {"X-New": "1"}
    body = json.loads(
        punctual("jobs", "update", job["id"], "--body", '{"name": "from-body"}', "--json").stdout
    )
    assert body["name"] == "from-body"
    assert punctual("jobs", "get", job["id"], "--json").stdout.count("from-body") == 1


def test_update_errors(punctual):
    job = create(punctual)
    nothing = punctual("jobs", "update", job["id"], ok=False)
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    both = punctual("jobs", "update", job["id"], "--cron", "* * * * *", "--interval-s", "5", ok=False)
    assert both.exit_code == 2 and "one of --cron" in both.output
    invalid = punctual("jobs", "update", job["id"], "--cron", "nope", ok=False)
    assert invalid.exit_code == 1 and "422" in invalid.stderr and "schedule.cron" in invalid.stderr
    cancelled = json.loads(punctual("jobs", "cancel", job["id"], "--json").stdout)
    conflict = punctual("jobs", "update", cancelled["id"], "--name", "late", ok=False)
    assert conflict.exit_code == 1 and "409" in conflict.stderr


def test_dead_letters_and_replay(punctual, api_settings):
    job = create(punctual)
    dead = [insert_run(api_settings, job) for _ in range(3)]
    listed = json.loads(punctual("dead-letters", "--json").stdout)
    assert [r["id"] for r in listed["items"]] == [str(run["run_id"]) for run in reversed(dead)]
    assert {r["job_name"] for r in listed["items"]} == {"cli-job"}
    page = json.loads(punctual("dead-letters", "--limit", "2", "--json").stdout)
    assert len(page["items"]) == 2 and page["next_cursor"]
    assert len(json.loads(punctual("dead-letters", "--all", "--limit", "1", "--json").stdout)) == 3
    table = punctual("dead-letters").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "JOB", "JOB", "NAME", "SCHEDULED"] and "HTTP 500" in table[1]
    assert job["id"] in table[1] and "cli-job" in table[1]

    # The replay prints the new attempt, the run that will fire: same occurrence, attempt 1.
    attempt = json.loads(punctual("runs", "replay", str(dead[0]["run_id"]), "--json").stdout)
    assert attempt["id"] != str(dead[0]["run_id"]) and attempt["state"] == "claimed"
    assert attempt["attempt"] == 1 and attempt["job_id"] == job["id"]
    assert attempt["scheduled_for"] == listed["items"][-1]["scheduled_for"]
    assert str(dead[0]["run_id"]) not in punctual("dead-letters", "--json").stdout
    again = punctual("runs", "replay", str(dead[0]["run_id"]), ok=False)
    assert again.exit_code == 1 and "409" in again.stderr
    row = punctual("runs", "replay", str(dead[1]["run_id"])).stdout.splitlines()[1]
    assert "claimed" in row and str(dead[1]["run_id"]) not in row


def test_replay_of_a_dead_one_off_prints_the_attempt_its_next_claim_makes(
    punctual, api_settings, monkeypatch
):
    """A dead one-off goes back to `scheduled` and the poller makes its run; with no
    poller here the command says so after its short look, and prints the job."""
    import app.cli.runs

    monkeypatch.setattr(app.cli.runs, "REPLAY_LOOK_S", 0.3)
    job = json.loads(
        punctual(
            "jobs",
            "create",
            "--name",
            "once",
            "--run-at",
            "2031-01-01T00:00:00Z",
            "--target-url",
            "http://127.0.0.1:9/hook",
            "--json",
        ).stdout
    )
    engine, key = engine_of(api_settings, job["id"])
    with engine.begin() as conn:
        conn.execute(
            jobs_table.update().where(jobs_table.c.job_id == key).values(state="dead", next_run_at=None)
        )
    dead = insert_run(api_settings, job, origin="schedule")
    result = punctual("runs", "replay", str(dead["run_id"]), "--json")
    assert json.loads(result.stdout)["state"] == "scheduled"
    assert "due again now" in result.stderr and f"punctual jobs runs {job['id']}" in result.stderr


def test_api_errors_go_to_stderr_with_every_field(punctual):
    result = punctual(
        "jobs", "create", "--name", "bad", "--cron", "nope", "--target-url", "ftp://x", ok=False
    )
    assert result.exit_code == 1
    assert "422" in result.stderr and "schedule.cron" in result.stderr and "target.url" in result.stderr
    missing = punctual("jobs", "get", "00000000-0000-0000-0000-000000000000", ok=False)
    assert missing.exit_code == 1 and "404" in missing.stderr


def test_preview_table_and_json(punctual):
    table = punctual(
        "preview",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--count",
        "2",
        "--after",
        "2026-03-28T12:00:00Z",
    ).stdout
    assert "gap_shifted" in table and "2026-03-29T01:00:00Z" in table
    data = json.loads(punctual("preview", "*/5 * * * *", "--count", "3", "--json").stdout)
    assert len(data["items"]) == 3


def test_no_api_key_is_a_clear_error(live_server):
    result = CliRunner().invoke(
        main, ["jobs", "list"], env={"PUNCTUAL_URL": live_server, "PUNCTUAL_API_KEY": ""}
    )
    assert result.exit_code == 2 and "PUNCTUAL_API_KEY" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_punctual_api_serves_under_gunicorn_and_shuts_down_gracefully(api_settings, alice):
    port = _free_port()
    env = {
        **os.environ,
        "PUNCTUAL_DATABASE_URLS": ",".join(api_settings.database_urls),
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "api", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60  # generous: CI boxes can be busy
        health = None
        while health is None:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            except requests.ConnectionError:
                if server.poll() is not None or time.time() > deadline:
                    server.kill()
                    pytest.fail(f"punctual api did not come up:\n{server.communicate()[1]}")
                time.sleep(0.2)
        assert health.status_code == 200
        with requests.Session() as session:
            jobs = session.get(
                f"http://127.0.0.1:{port}/jobs",
                headers={"Authorization": f"Bearer {alice.api_key}"},
                timeout=10,
            )
        assert jobs.status_code == 200
        server.send_signal(signal.SIGTERM)
        _, log = server.communicate(timeout=60)
        assert server.returncode == 0, log
        assert "gthread" in log and "Shutting down" in log, log
    finally:
        if server.poll() is None:
            server.kill()


def _client_commands():
    """(path, command) of every command that talks to the API: one rule for them all."""
    from app.cli.connection import ClientCommand

    def walk(command, path):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, path + (name,))
        elif isinstance(command, ClientCommand):
            yield path, command

    return list(walk(main, ()))


# What a command needs besides its arguments to send a request at all.
_NEEDS = {
    ("jobs", "update"): ["--name", "x"],
    ("jobs", "backfill"): ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02T00:00:00Z"],
}


def _arguments(path, command, empty_file: str) -> list[str]:
    """Made-up arguments: an unknown id (the API answers 404), a cron expression, or a
    file of no jobs."""
    made = {"cron": "* * * * *", "file": empty_file}
    return _NEEDS.get(path, []) + [
        made.get(p.name, str(uuid.uuid4())) for p in command.params if isinstance(p, click.Argument)
    ]


def test_every_client_command_takes_url_and_api_key_after_its_group_or_itself(live_server, alice, tmp_path):
    commands = _client_commands()
    empty_file = tmp_path / "no-jobs.yaml"
    empty_file.write_text("jobs: []\n")
    names = {" ".join(path) for path, _ in commands}
    assert {"jobs list", "jobs create", "jobs update", "runs replay", "dead-letters", "preview"} <= names
    # The environment points elsewhere, with a wrong key: what is typed must win.
    env = {"PUNCTUAL_URL": "http://127.0.0.1:9", "PUNCTUAL_API_KEY": "pk_wrong"}
    right = ["--url", live_server, "--api-key", alice.api_key]
    for path, command in commands:
        args = _arguments(path, command, str(empty_file))
        placements = [[*path, *args, *right]]
        if len(path) > 1:  # after the group, and the subcommand's own winning over the group's
            placements.append([*path[:-1], *right, path[-1], *args])
            placements.append([*path[:-1], "--api-key", "pk_wrong", path[-1], *args, *right])
        for argv in placements:
            result = CliRunner().invoke(main, argv, env=env)
            said = result.output + result.stderr
            # 0, or the API's own 404/422 for the made-up arguments: never a refused option or key.
            assert result.exit_code == 0 or (
                result.exit_code == 1 and (" 404 " in said or " 422 " in said)
            ), (
                argv,
                result.exit_code,
                said,
            )
    as_json = CliRunner().invoke(main, ["jobs", "--json", "list", *right], env=env)
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["items"] is not None


def test_update_keeps_the_rest_of_the_schedule_or_says_what_it_would_lose(punctual):
    job = create(punctual, "--start-at", "2030-01-01T00:00:00Z", "--end-at", "2031-01-01T00:00:00Z")
    assert job["schedule"]["timezone"] == "Europe/Berlin"
    weekdays = json.loads(punctual("jobs", "update", job["id"], "--cron", "0 10 * * 1-5", "--json").stdout)
    assert weekdays["schedule"] == {
        "cron": "0 10 * * 1-5",
        "timezone": "Europe/Berlin",
        "start_at": "2030-01-01T00:00:00Z",
        "end_at": "2031-01-01T00:00:00Z",
    }
    moved = json.loads(
        punctual(
            "jobs", "update", job["id"], "--cron", "0 11 * * *", "--timezone", "Asia/Tokyo", "--json"
        ).stdout
    )
    assert (
        moved["schedule"]["timezone"] == "Asia/Tokyo"
        and moved["schedule"]["end_at"] == "2031-01-01T00:00:00Z"
    )
    # An interval takes start_at and end_at but no time zone: refused, in one line, nothing changed.
    lost = punctual("jobs", "update", job["id"], "--interval-s", "60", ok=False)
    assert lost.exit_code == 2 and lost.stderr.count("\n") == 1
    assert "timezone Asia/Tokyo" in lost.stderr and "--body" in lost.stderr
    assert json.loads(punctual("jobs", "get", job["id"], "--json").stdout)["schedule"] == moved["schedule"]
    # --body's whole schedule replaces it on purpose; then an interval keeps the bounds.
    body = json.dumps({"schedule": {"cron": "0 0 * * *", "end_at": "2031-01-01T00:00:00Z"}})
    replaced = json.loads(punctual("jobs", "update", job["id"], "--body", body, "--json").stdout)
    assert replaced["schedule"] == {"cron": "0 0 * * *", "timezone": "UTC", "end_at": "2031-01-01T00:00:00Z"}
    every = json.loads(punctual("jobs", "update", job["id"], "--interval-s", "60", "--json").stdout)
    assert every["schedule"] == {"interval_s": 60, "end_at": "2031-01-01T00:00:00Z"}


def test_create_with_id_only_prints_the_id_alone(punctual, tmp_path):
    job_id = punctual(
        "jobs", "create", "--name", "q", "--interval-s", "60", "--target-url", "http://127.0.0.1:9/h", "-q"
    ).stdout
    assert job_id.strip() == json.loads(punctual("jobs", "get", job_id.strip(), "--json").stdout)["id"]
    assert job_id == job_id.strip() + "\n"
    lines = tmp_path / "jobs.jsonl"
    good = {
        "name": "f",
        "target": {"type": "webhook", "url": "http://127.0.0.1:9/h"},
        "schedule": {"interval_s": 9},
    }
    lines.write_text(json.dumps(good) + "\n" + json.dumps({"name": "bad"}) + "\n")
    result = punctual("jobs", "create", "--from-file", str(lines), "--id-only", ok=False)
    assert result.exit_code == 1
    [created] = result.stdout.split()
    uuid.UUID(created)
    assert "line 2: 422" in result.stderr
    both = punctual("jobs", "create", "--name", "x", "-q", "--json", ok=False)
    assert both.exit_code == 2


def test_preview_computes_locally_without_a_server_and_says_the_same(punctual, live_server, alice):
    argv = [
        "preview",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--count",
        "4",
        "--after",
        "2026-03-27T12:00:00Z",
    ]
    nowhere = {"PUNCTUAL_URL": "", "PUNCTUAL_API_KEY": ""}
    for extra in ([], ["--json"]):
        local = CliRunner().invoke(main, [*argv, *extra], env=nowhere)
        assert local.exit_code == 0, local.output
        assert local.stdout == punctual(*argv, *extra).stdout  # PUNCTUAL_URL set: the API answered
        named = CliRunner().invoke(
            main, [*argv, *extra, "--url", live_server, "--api-key", alice.api_key], env=nowhere
        )
        assert named.stdout == local.stdout
    assert "gap_shifted" in local.stdout or "gap_shifted" in json.dumps(json.loads(local.stdout))
    bad = CliRunner().invoke(main, ["preview", "nope", "--count", "0"], env=nowhere)
    assert bad.exit_code == 1 and bad.stderr == punctual("preview", "nope", "--count", "0", ok=False).stderr
    assert "cron" in bad.stderr and "count" in bad.stderr
