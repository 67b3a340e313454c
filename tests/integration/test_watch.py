"""What beat reads of each shard's work (app.pollers.watch) on real Postgres, and
whether its gate (app.beat.gate) sends a poll or a sweep for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.beat.gate import Gate, wants_poll
from app.beat.scheduler import read_work
from app.core.timefmt import utcnow
from app.pollers.claim import claim_batch
from app.pollers.watch import next_work_statement
from app.registry.engines import registry_for
from tests.rows import ago, insert_jobs, job_row

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(pg_settings, truncate):
    truncate()
    return registry_for(pg_settings)


def test_an_empty_registry_has_no_work_on_any_shard(registry, pg_settings):
    work = read_work(registry)
    assert sorted(work) == list(range(pg_settings.shards))
    assert all(w is not None and w == type(w)() for w in work.values())
    assert not any(wants_poll(w, utcnow(), pg_settings.claim_ahead_s) for w in work.values())


def test_each_kind_of_work_is_read_on_its_own_shard(registry, pg_settings):
    now = utcnow()
    later = job_row(pg_settings.shards, run_at=now + timedelta(hours=1))
    insert_jobs(registry, [later])
    work = read_work(registry)
    assert work[later["shard"]].job_due == later["next_run_at"]
    assert not wants_poll(work[later["shard"]], now, pg_settings.claim_ahead_s)
    due = job_row(pg_settings.shards, run_at=ago(1))
    insert_jobs(registry, [due])
    work = read_work(registry)
    assert wants_poll(work[due["shard"]], utcnow(), pg_settings.claim_ahead_s)
    others = [w for s, w in work.items() if s not in (due["shard"], later["shard"])]
    assert all(w is not None and w.job_due is None for w in others)

    # Claimed: no longer due; it holds a lease.
    claim_batch(registry.engine_for_shard(due["shard"]), due["shard"], utcnow(), pg_settings)
    shard = read_work(registry)[due["shard"]]
    assert shard is not None
    assert shard.job_due is None or shard.job_due == later["next_run_at"]
    assert shard.lease_ends is not None


def test_every_probe_uses_its_partial_index(registry, pg_settings):
    with registry.engines[0].connect() as conn:
        plan = "\n".join(
            row[0] for row in conn.execute(sa.text("EXPLAIN " + str(next_work_statement((0, 1)))))
        )
    for index in ("ix_jobs_due", "ix_runs_outbox", "ix_jobs_leased", "ix_runs_leased", "ix_runs_finished"):
        assert index in plan, plan
    assert "Seq Scan" not in plan, plan


def test_a_registry_that_cannot_be_read_gets_every_tick(pg_settings):
    def fails():
        raise sa.exc.OperationalError("SELECT", {}, Exception("down"))

    gate = Gate(pg_settings, fails)
    assert gate.poll(0, utcnow()) and gate.sweep(0, utcnow())
