"""The completion against the real registry with any outcome at all: every attempt of a
batch is written, by the rules, whatever its status, error text or Retry-After, and
another owner's attempt in the same batch is written as it finished.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.core.retries import CallOutcome
from app.core.timefmt import utcnow
from app.lifecycle import lease
from app.lifecycle.completion import Finished, complete
from app.pollers.claim import claim_batch
from app.registry.engines import registry_for
from tests.fuzz.budget import fuzz_settings
from tests.rows import insert_jobs, job, job_row, runs_of

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]


@pytest.fixture(scope="module")
def registry(pg_dsns):
    from app.settings import Settings

    settings = Settings.from_env({"PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns), "PUNCTUAL_DB_POOL_SIZE": "4"})
    return registry_for(dataclasses.replace(settings, lease_s=30.0))


# Text with what a target's bytes may become: NUL, lone surrogates (aiohttp decodes
# with surrogateescape), C1 controls, any script; sometimes far too long.
_HOSTILE_TEXT = st.one_of(
    st.text(
        alphabet=st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udcff", "\x85"])),
        max_size=60,
    ),
    st.integers(1000, 200_000).map(lambda n: "e" * n),
)
_OUTCOMES = st.builds(
    CallOutcome,
    status_code=st.one_of(st.none(), st.integers(-(10**12), 10**12), st.integers(100, 599)),
    error=st.one_of(st.none(), _HOSTILE_TEXT),
    retryable_error=st.booleans(),
    retry_after=st.one_of(st.none(), _HOSTILE_TEXT, st.integers(0, 6000).map(lambda n: "9" * n)),
)


@fuzz_settings(examples=30)
@given(outcomes=st.lists(_OUTCOMES, min_size=1, max_size=8), recurring=st.booleans())
@example(outcomes=[CallOutcome(status_code=503, retry_after="9" * 400)], recurring=False)
def test_every_attempt_of_a_batch_is_written_by_the_rules(registry, outcomes, recurring):
    shards = registry.settings.shards
    # `due` on the cron grid and the next occurrence after `now`: the claim writes no
    # misfire rows, whatever second of the minute the example runs in.
    due = utcnow().replace(second=0, microsecond=0)
    now = due + timedelta(seconds=1)
    schedule = {"cron": "* * * * *", "first": due} if recurring else {"run_at": due}
    rows = [job_row(shards, owner="hostile", max_attempts=3, **schedule) for _ in outcomes]
    rows.append(job_row(shards, owner="other", run_at=due))
    insert_jobs(registry, rows)
    found = []
    for shard in sorted({row["shard"] for row in rows}):
        found += claim_batch(registry.engine_for_shard(shard), shard, now, registry.settings).runs
    ours = {row["job_id"] for row in rows}
    found = [run for run in found if run.job_id in ours]  # a retry of an earlier example may be due too
    started = lease.start(registry, found, now)
    assert started == {run.run_id for run in found}
    by_job = {run.job_id: run for run in found}
    batch = [
        Finished(by_job[row["job_id"]], outcome, now, called_at=now)
        for row, outcome in zip(rows, [*outcomes, CallOutcome(status_code=200)], strict=True)
    ]

    report = complete(registry, batch, now, rand=lambda: 0.5)

    assert report.applied == len(batch) and report.stale == 0
    for row in rows:
        [run] = runs_of(registry, row["job_id"])
        assert run["state"] in ("succeeded", "failed", "dead")
        assert run["error"] is None or len(run["error"]) <= 1000
        assert run["status_code"] is None or 100 <= run["status_code"] <= 999
        after = job(registry, row["job_id"])
        assert after["lease_token"] is None and after["state"] != "running"
        if after["state"] == "scheduled" and run["state"] == "failed":  # a retry: never past its cap
            assert after["next_run_at"] <= now + timedelta(seconds=3600)
    assert runs_of(registry, rows[-1]["job_id"])[0]["state"] == "succeeded"
