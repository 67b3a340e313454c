"""PUNCTUAL_LOG_FORMAT=json: one JSON object per line from beat, a worker and `punctual migrate`.

Real processes on the module's services (Celery with -q, as docs/api.md "Logs" says
to run it in JSON mode). A job due now is called on a local sink; then every line
each process wrote, stdout and stderr together, must parse as one JSON object, the
worker's lines about the call must name the job, the run, the shard and the
attempt, and beat must have said what it schedules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.api import create_app
from app.core.timefmt import format_instant, utcnow
from app.registry.engines import registry_for
from app.services.owners import create_key
from tests.e2e.processes import CELERY, REPO, Proc, wait_ready
from tests.sink import Sink

pytestmark = pytest.mark.e2e


def _entries(proc: Proc) -> list[dict]:
    lines = [line for line in proc.log_path.read_text(errors="replace").splitlines() if line.strip()]
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            pytest.fail(f"{proc.name} wrote a line that is not JSON: {line!r}")
    assert entries, f"{proc.name} wrote nothing"
    return entries


def test_beat_and_a_worker_log_one_json_object_per_line_naming_the_run(stack_env, settings, tmp_path):
    env = {**stack_env, "PUNCTUAL_LOG_FORMAT": "json"}
    shards = ",".join(f"shard-{s:02d}" for s in range(settings.shards))
    # DEBUG: the worker's per-call line is a debug line; every library's lines come along.
    worker = Proc(
        "worker",
        [
            CELERY,
            "-A",
            "app",
            "-q",
            "worker",
            "-Q",
            shards,
            "-c",
            "2",
            "-n",
            "json@%h",
            "--loglevel",
            "DEBUG",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env,
        tmp_path,
    )
    beat = Proc("beat", [CELERY, "-A", "app", "-q", "beat", "--loglevel", "INFO"], env, tmp_path)
    sink = Sink()
    try:
        wait_ready(worker, 2.0)
        wait_ready(beat, 1.0)
        key = create_key(registry_for(settings), "json-logs")
        response = (
            create_app(settings)
            .test_client()
            .post(
                "/jobs",
                json={
                    "name": "json",
                    "target": {"type": "webhook", "url": sink.url("/json")},
                    "schedule": {"run_at": format_instant(utcnow())},
                },
                headers={"Authorization": f"Bearer {key.api_key}"},
            )
        )
        assert response.status_code == 201, response.get_json()
        job_id = response.get_json()["id"]
        sink.wait_for(1, "/json", timeout_s=60)
    finally:
        sink.close()
        beat.stop()
        worker.stop()

    worker_lines = _entries(worker)
    assert {entry["process"] for entry in worker_lines} == {"worker"}
    about_the_run = [entry for entry in worker_lines if entry.get("job_id") == job_id]
    assert about_the_run, "no worker line names the job"
    for entry in about_the_run:
        assert entry["run_id"] and entry["attempt"] == 1 and isinstance(entry["shard"], int), entry
    beat_lines = _entries(beat)
    assert {entry["process"] for entry in beat_lines} == {"beat"}
    assert any(
        entry["message"].startswith("beat alive: sending punctual.poll every 0.25 s")
        and entry["level"] == "INFO"
        for entry in beat_lines
    ), beat_lines


def test_migrate_logs_one_json_object_per_line(stack_env):
    env = {**stack_env, "PUNCTUAL_LOG_FORMAT": "json"}
    import os

    result = subprocess.run(
        [str(Path(sys.executable).parent / "punctual"), "migrate"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    assert len(entries) == 2  # one per physical shard
    assert all(
        entry["process"] == "migrate" and entry["message"].endswith(": up to date") for entry in entries
    )
    assert all("@" in entry["database"] for entry in entries)
