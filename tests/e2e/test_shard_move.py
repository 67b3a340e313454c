"""A shard moves onto a third database while its jobs fire, with a real worker, beat
and `punctual shards move`: an interval job every second keeps firing, one-offs
due during the move fire once each, and the API finds the jobs where they went.
Times are generous ceilings, never exact."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.timefmt import format_instant, utcnow
from app.registry.engines import registry_for
from app.registry.migrate import establish_cluster
from app.registry.schema import jobs, runs
from app.registry.sharding import shard_for
from app.services.idempotency import job_id_for
from tests.conftest import _pg_url, create_database, drop_database
from tests.e2e.conftest import E2E_SHARDS, make_env
from tests.e2e.processes import REPO
from tests.rows import insert_jobs, job_row

pytestmark = pytest.mark.e2e

SHARD = 1
BULK = 20_000  # far-future jobs on the shard, so the copy lasts a few seconds


@pytest.fixture(scope="module")
def three_dsns(pg_dsns, pg_admin, pg_template):
    """The module's cluster of two, plus a third database added at the end."""
    name = create_database(pg_admin, pg_template)
    dsns = (*pg_dsns, _pg_url(name))
    establish_cluster(dsns, E2E_SHARDS)
    yield dsns
    drop_database(pg_admin, name)


@pytest.fixture(scope="module")
def stack_env(three_dsns, amqp_url, module_redis_prefix):
    return make_env(three_dsns, amqp_url, module_redis_prefix)


def on_shard(api, shard: int, prefix: str, **body) -> dict:
    """Create a job whose id lands on `shard` (an Idempotency-Key chosen for it)."""
    for n in range(10_000):
        key = f"{prefix}-{n}"
        if shard_for(job_id_for("e2e", key), E2E_SHARDS) == shard:
            response = api.client.post(
                "/jobs", json={"name": prefix, **body}, headers={**api.headers, "Idempotency-Key": key}
            )
            assert response.status_code == 201, response.get_json()
            return response.get_json()
    raise AssertionError("no key lands on the shard")


def test_a_shard_moves_while_its_jobs_fire(stack, api, sink, settings, stack_env):
    registry = registry_for(settings)
    assert registry.reload_map().shard_index[SHARD] != 2
    insert_jobs(
        registry,
        [job_row(E2E_SHARDS, shard=SHARD, run_at=utcnow() + timedelta(days=30)) for _ in range(BULK)],
    )
    ticking = on_shard(
        api,
        SHARD,
        "every-second",
        target={"type": "webhook", "url": sink.url("/tick")},
        schedule={"interval_s": 1},
    )
    sink.wait_for(3, "/tick", timeout_s=20)
    start = utcnow()
    one_offs = [
        on_shard(
            api,
            SHARD,
            f"once-{i}",
            target={"type": "webhook", "url": sink.url(f"/once-{i}")},
            schedule={"run_at": format_instant(start + timedelta(seconds=0.5 + i / 2))},
        )
        for i in range(12)
    ]
    env = {"PATH": os.environ.get("PATH", ""), **stack_env}
    moved = subprocess.run(
        [sys.executable, "-m", "app.cli", "shards", "move", str(SHARD), "--to", "2"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert moved.returncode == 0, moved.stderr
    moved_at = time.time()
    routing = registry.reload_map()
    assert routing.shard_index[SHARD] == 2 and routing.map.placements[SHARD].move_step is None

    # Every one-off fired exactly once, wherever it was when it fell due.
    for i, job in enumerate(one_offs):
        sink.wait_for(1, f"/once-{i}", timeout_s=30)
        api.wait_job(job["id"], lambda j: j["state"] == "completed", timeout_s=30)
    # The interval job kept firing through the move and fires on the new database.
    sink.wait_for(len(sink.calls("/tick")) + 3, "/tick", timeout_s=20)
    time.sleep(2)  # late duplicates, if any, would arrive by now
    for i in range(len(one_offs)):
        assert len(sink.calls(f"/once-{i}")) == 1, f"one-off {i} fired {len(sink.calls(f'/once-{i}'))} times"
    ticks = [call.at for call in sink.calls("/tick")]
    during = [t for t in ticks if start.timestamp() - 5 <= t <= moved_at + 10]
    longest_gap = max(b - a for a, b in itertools.pairwise(during))
    print(f"move: {moved.stdout.strip()}; longest gap between calls of the 1 s job: {longest_gap:.2f} s")
    assert longest_gap < 8, longest_gap
    keys = [call.header("Idempotency-Key") for call in sink.calls("/tick")]
    assert len(keys) == len(set(keys)), "an occurrence of the interval job fired twice"

    # The rows live on the new database only, and the API finds them there.
    with registry.engines[2].connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(jobs).where(jobs.c.shard == SHARD)).scalar()
            >= BULK + len(one_offs) + 1
        )
    for index in (0, 1):
        with registry.engines[index].connect() as conn:
            assert (
                conn.execute(
                    sa.select(sa.func.count()).select_from(jobs).where(jobs.c.shard == SHARD)
                ).scalar()
                == 0
            )
            assert (
                conn.execute(
                    sa.select(sa.func.count()).select_from(runs).where(runs.c.shard == SHARD)
                ).scalar()
                == 0
            )
    assert api.job(ticking["id"])["state"] in ("scheduled", "running")
    history = api.runs(ticking["id"])
    assert len(history) >= len(during) - 1 and not [r for r in history if r["state"] == "dead"]
