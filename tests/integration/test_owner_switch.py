"""The owner switch on real Postgres: a paused owner's due rows are not claimed, its
waiting runs are neither published nor taken back by the janitor, the pause takes
back what was claimed, the resume lets it all go; `punctual owners pause|resume`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest

from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.pollers import janitor, relay
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from app.registry.records import run_row
from app.registry.schema import runs
from app.services.jobs import trigger_job
from app.services.owners import OwnerDirectory, activity, claim_view, create_key, pause_owner, resume_owner
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    registry = registry_for(pg_settings)
    for owner in ("acme", "globex"):
        create_key(registry, owner)
    return registry


def due(registry, owner: str, count: int = 1, shard: int = 0) -> list[dict]:
    rows = [
        job_row(registry.settings.shards, owner=owner, run_at=utcnow() - timedelta(seconds=1), shard=shard)
        for _ in range(count)
    ]
    insert_jobs(registry, rows)
    return rows


def claim(registry, shard: int = 0, **kw):
    return claim_batch(registry.engine_for_shard(shard), shard, utcnow(), registry.settings, **kw)


def test_the_claim_passes_a_paused_owners_due_rows_by(registry):
    due(registry, "acme", 3)
    due(registry, "globex", 2)
    first = claim(registry, paused={"acme"})
    assert {run.owner for run in first.runs} == {"globex"} and len(first.runs) == 2
    assert claim(registry, paused={"acme"}).runs == []  # only the paused owner's rows are left
    assert {run.owner for run in claim(registry).runs} == {"acme"}


def test_a_paused_owner_alone_with_due_rows_claims_nothing(registry):
    due(registry, "acme", 2)
    result = claim(registry, paused={"acme", "nobody"})
    assert result.runs == [] and not result.full


def test_pause_takes_back_what_was_claimed_and_holds_what_waits_then_resume_releases_it(registry):
    [claimed] = due(registry, "acme")
    [started] = due(registry, "acme")
    [triggered] = due(registry, "acme", shard=1)
    runs_claimed = {run.job_id: run for run in claim(registry).runs}
    assert lease.start(registry, [runs_claimed[started["job_id"]]], utcnow())
    extra = trigger_job(registry, "acme", str(triggered["job_id"]), utcnow())
    relay.sweep(registry.engine_for_shard(1), 1, utcnow(), lambda shard, messages: None)  # published

    paused = pause_owner(registry, "acme", settle_s=0)

    assert (paused.taken_back, paused.held) == (1, 1)
    assert runs_of(registry, claimed["job_id"]) == []  # never started: no attempt spent
    again = job(registry, claimed["job_id"])
    assert (again["state"], again["lease_token"], again["next_run_at"]) == (
        "scheduled",
        None,
        claimed["next_run_at"],
    )
    assert [run["state"] for run in runs_of(registry, started["job_id"])] == ["running"]  # it finishes
    [held] = [run for run in runs_of(registry, triggered["job_id"]) if run["run_id"] == extra["run_id"]]
    assert held["lease_token"] != extra["lease_token"]  # its message, already sent, starts nothing
    assert (held["state"], held["published"]) == ("claimed", False)
    assert claim_view(registry).paused == {"acme"}
    assert [item.paused for item in activity(registry)] == [True, False]

    sent: list = []
    engine = registry.engine_for_shard(1)
    assert relay.sweep(engine, 1, utcnow(), lambda shard, messages: sent.append(messages), held={"acme"}) == 0
    assert claim(registry, paused={"acme"}).runs == []

    assert resume_owner(registry, "acme") == 1
    renewed = next(run for run in runs_of(registry, triggered["job_id"]) if run["run_id"] == extra["run_id"])
    assert renewed["leased_until"] > utcnow() + timedelta(seconds=60)
    assert relay.sweep(engine, 1, utcnow(), lambda shard, messages: sent.append(messages)) == 1
    assert claim_view(registry).paused == frozenset()


def test_the_janitor_leaves_a_paused_owners_waiting_runs_to_the_resume(registry):
    [row] = due(registry, "acme")
    now = utcnow()
    retry = run_row(
        job_id=row["job_id"],
        shard=row["shard"],
        owner="acme",
        origin="trigger",
        scheduled_for=now,
        attempt=2,
        state="claimed",
        target=row["target"],
        retry={"max_attempts": 5},
        now=now,
        lease_token=uuid.uuid4(),
        leased_until=now - timedelta(seconds=1),
        due_at=now,
        published=False,
    )
    with registry.engine_for_shard(row["shard"]).begin() as conn:
        conn.execute(runs.insert().values(retry))
    engine = registry.engine_for_shard(row["shard"])
    assert janitor.expire(engine, row["shard"], utcnow(), registry.settings, held={"acme"}) == 0
    assert janitor.expire(engine, row["shard"], utcnow(), registry.settings) == 1


def test_the_directory_reads_weights_and_switches_together(registry):
    directory = OwnerDirectory(registry, ttl_s=60)
    assert directory.paused() == frozenset()
    with registry.home.begin() as conn:
        conn.exec_driver_sql("UPDATE owners SET paused_at = now() WHERE owner = 'acme'")
    assert directory.paused() == frozenset()  # cached with the weights
    assert OwnerDirectory(registry, ttl_s=0).claim_view().paused == {"acme"}


def _punctual(settings, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PUNCTUAL_DATABASE_URLS": ",".join(settings.database_urls),
        "PUNCTUAL_SHARDS": str(settings.shards),
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "owners", *args], capture_output=True, text=True, env=env
    )


def test_owners_pause_and_resume_from_the_command_line(registry, pg_settings):
    paused = _punctual(pg_settings, "pause", "acme")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == "acme: paused (0 claimed runs taken back, 0 runs held until the resume)"
    listed = [json.loads(line) for line in _punctual(pg_settings, "list", "--json").stdout.splitlines()]
    assert [(row["owner"], row["paused"]) for row in listed] == [("acme", True), ("globex", False)]
    assert _punctual(pg_settings).stdout.splitlines()[1].split()[-1] == "paused"
    resumed = _punctual(pg_settings, "resume", "acme")
    assert resumed.returncode == 0 and resumed.stdout.strip() == "acme: resumed (0 held runs released)"
    unknown = _punctual(pg_settings, "pause", "nobody")
    assert unknown.returncode == 1 and "no owner 'nobody'" in unknown.stderr
