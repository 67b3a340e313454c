"""The bulk writes, each named once: which rows, which columns, which fence.

A statement here is a shape (app.registry.bulk renders and sends it); the values come
with each batch. Every bulk write in app/ goes through one of these, so the SQL of a
write is found here by name, and its rendered form (`sql()`: every column travelling
in the recordset, constants as `:name`) is pinned by a snapshot per statement under
tests/snapshots/sql/ (`python -m tests.snapshots --update` rewrites them).

A write that sets fewer columns than its statement (a settlement sets only what it
changes; a completion without a call leaves started_at) names the columns it sends:
they must be among the statement's, as must its constants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from app.registry import bulk
from app.registry.bulk import (
    LeasedInsert,
    Update,
    insert_new_sql,
    insert_sql,
    leased_insert_sql,
    state_in,
    update_sql,
)
from app.registry.schema import jobs, runs


@dataclass(frozen=True)
class BulkUpdate:
    """A bulk UPDATE (app.registry.bulk.update_many): rows matched by `match` (the key,
    then the fence columns), `columns` set from each row, `constants` bound once."""

    name: str
    table: sa.Table
    match: tuple[str, ...]
    columns: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    where: str | None = None
    returning: str | None = None
    lock_in_key_order: bool = False

    def sql(self) -> str:
        return update_sql(
            self.table,
            self.match,
            self.columns,
            self.constants,
            self.where,
            self.returning,
            self.lock_in_key_order,
        )

    def of(
        self,
        rows: Sequence[Mapping[str, Any]],
        constants: Mapping[str, Any],
        columns: Sequence[str] | None = None,
    ) -> Update:
        """This statement for a batch: `rows`, the `constants`' values, and `columns`
        when the batch sets only some of the statement's (a ValueError otherwise)."""
        if columns is None:
            columns = self.columns
        elif not set(columns) <= set(self.columns):
            raise ValueError(f"{self.name} sets no {sorted(set(columns) - set(self.columns))}")
        if not set(constants) <= set(self.constants):
            raise ValueError(f"{self.name} binds no {sorted(set(constants) - set(self.constants))}")
        return Update(
            self.table,
            rows,
            self.match,
            columns,
            dict(constants),
            self.where,
            self.returning,
            self.lock_in_key_order,
        )

    def update(
        self,
        conn: sa.Connection,
        rows: Sequence[Mapping[str, Any]],
        constants: Mapping[str, Any],
        columns: Sequence[str] | None = None,
    ) -> list:
        """Write `of(rows, constants, columns)`; returns the `returning` values."""
        return bulk.write(conn, self.of(rows, constants, columns))


@dataclass(frozen=True)
class BulkInsert:
    """A bulk INSERT of rows that all carry `columns` (app.registry.bulk.insert_many),
    or, with `conflict_key`, of the rows whose key is not taken (insert_new)."""

    name: str
    table: sa.Table
    columns: tuple[str, ...]
    conflict_key: str | None = None

    def sql(self) -> str:
        if self.conflict_key is None:
            return insert_sql(self.table, self.columns)
        return insert_new_sql(self.table, self.columns, self.conflict_key)

    def insert(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        bulk.insert_many(conn, self.table, rows)

    def insert_new(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> set:
        """The keys of the rows inserted (the others' keys were taken)."""
        assert self.conflict_key is not None, f"{self.name} has no conflict key"
        return bulk.insert_new(conn, self.table, rows, self.conflict_key)


@dataclass(frozen=True)
class BulkLeasedInsert:
    """A bulk INSERT of rows that may exist only under a lease `lease_table` holds
    (app.registry.bulk.LeasedInsert, for update_together): `columns` travel per row,
    `constants` are bound once; a row whose `conflict` key exists takes `upsert` when
    it is in one of `upsert_states` under the same token."""

    name: str
    table: sa.Table
    columns: tuple[str, ...]
    constants: tuple[str, ...]
    lease_table: sa.Table
    key: str
    lease_states: tuple[str, ...]
    conflict: str
    upsert: tuple[str, ...]
    upsert_states: tuple[str, ...]

    def sql(self) -> str:
        return (
            leased_insert_sql(
                self.table,
                self.columns,
                self.constants,
                self.lease_table,
                self.key,
                self.lease_states,
                self.conflict,
                self.upsert,
                self.upsert_states,
            )
            + ";"
        )

    def of(self, rows: Sequence[Mapping[str, Any]], constants: Mapping[str, Any]) -> LeasedInsert:
        """This statement for a batch: `rows` and the `constants`' values (all of them)."""
        if set(constants) != set(self.constants):
            raise ValueError(f"{self.name} binds {sorted(self.constants)}, not {sorted(constants)}")
        return LeasedInsert(
            self.table,
            rows,
            self.columns,
            {name: constants[name] for name in self.constants},
            self.lease_table,
            self.key,
            self.lease_states,
            self.conflict,
            self.upsert,
            self.upsert_states,
        )


_RUN_ROW = (
    "run_id",
    "job_id",
    "shard",
    "owner",
    "origin",
    "scheduled_for",
    "attempt",
    "state",
    "lease_token",
    "leased_until",
    "due_at",
    "published",
    "target",
    "retry",
    "started_at",
    "finished_at",
    "lateness_ms",
    "status_code",
    "error",
    "created_at",
    "updated_at",
)
_JOB_ROW = (
    "job_id",
    "shard",
    "owner",
    "name",
    "target",
    "payload",
    "schedule_kind",
    "run_at",
    "cron",
    "timezone",
    "interval_s",
    "start_at",
    "end_at",
    "retry_max_attempts",
    "retry_backoff_s",
    "retry_max_backoff_s",
    "misfire",
    "dst_gap",
    "dst_overlap",
    "jitter_s",
    "state",
    "next_run_at",
    "nominal_at",
    "attempt",
    "misfire_exempt",
    "skipped_after",
    "skipped_through",
    "lease_token",
    "leased_until",
    "idempotency_key",
    "request_hash",
    "created_at",
    "updated_at",
    "labels",
    "job_key",
    "rescheduled_at",
    "overlap",
)
_FENCED_JOB = ("job_id", "lease_token")
_FENCED_RUN = ("run_id", "lease_token")

# New run rows (app.registry.records.run_row): an `allow` job's claimed runs and
# skipped occurrences, next attempts, backfills.
INSERT_RUNS = BulkInsert("insert_runs", runs, _RUN_ROW)
# New jobs of a batch create (app.registry.records.new_job_row), in job id order.
INSERT_NEW_JOBS = BulkInsert("insert_new_jobs", jobs, _JOB_ROW, conflict_key="job_id")

# The claim (app.pollers.claim): jobs claimed for a run to start,
CLAIM_JOBS = BulkUpdate(
    "claim_jobs",
    jobs,
    ("job_id",),
    (
        "lease_token",
        "leased_until",
        "nominal_at",
        "next_run_at",
        "attempt",
        "skipped_after",
        "skipped_through",
    ),
    ("state", "updated_at"),
)
# jobs whose overlap is `allow` (the run holds its own lease; the cursor moves on past it),
PASS_JOBS = BulkUpdate(
    "pass_jobs",
    jobs,
    ("job_id",),
    ("state", "nominal_at", "next_run_at", "skipped_after", "skipped_through"),
    ("attempt", "misfire_exempt", "updated_at"),
)
# and jobs whose misfire plan runs nothing (the cursor moves on).
MOVE_JOBS = BulkUpdate(
    "move_jobs",
    jobs,
    ("job_id",),
    ("state", "nominal_at", "next_run_at"),
    ("attempt", "misfire_exempt", "skipped_after", "skipped_through", "updated_at"),
)

# A start (app.lifecycle.lease), one statement (bulk.update_together): the rows of runs
# leased on their jobs, written under the job's lease (a row a claim made before runs
# got theirs at their start, still claimed, is started in place), then the runs
# leased on their rows.
START_NEW_RUNS = BulkLeasedInsert(
    "start_new_runs",
    runs,
    (
        "run_id",
        "job_id",
        "lease_token",
        "shard",
        "owner",
        "scheduled_for",
        "attempt",
        "target",
        "retry",
        "lateness_ms",
    ),
    ("origin", "state", "leased_until", "published", "started_at", "created_at", "updated_at"),
    jobs,
    "job_id",
    ("running",),
    "run_id",
    ("state", "leased_until", "started_at", "lateness_ms", "updated_at"),
    ("claimed",),
)
START_RUNS = BulkUpdate(
    "start_runs",
    runs,
    _FENCED_RUN,
    ("lateness_ms", "leased_until"),
    ("state", "started_at", "updated_at"),
    where=state_in(runs, ("claimed",)),
    returning="run_id",
)
# A heartbeat (every started run holds the lease of its call on its row), its rows
# locked in key order first (bulk.locked_in_key_order), as a completion locks them.
HEARTBEAT_RUNS = BulkUpdate(
    "heartbeat_runs",
    runs,
    _FENCED_RUN,
    constants=("leased_until",),
    where=state_in(runs, ("running",)),
    returning="run_id",
    lock_in_key_order=True,
)

# A completion (app.lifecycle.completion): a worker's runs (started_at and lateness_ms
# only for those whose call went out), locked in key order first, as a heartbeat locks them,
FINISH_RUNS = BulkUpdate(
    "finish_runs",
    runs,
    _FENCED_RUN,
    ("state", "finished_at", "status_code", "error", "started_at", "lateness_ms"),
    ("leased_until", "updated_at"),
    where=state_in(runs, ("running",)),
    returning="run_id",
    lock_in_key_order=True,
)
# the janitor's, of runs whose lease expired claimed or running (no call known),
EXPIRE_RUNS = BulkUpdate(
    "expire_runs",
    runs,
    _FENCED_RUN,
    ("state", "finished_at", "status_code", "error"),
    ("leased_until", "updated_at"),
    where=state_in(runs, ("claimed", "running")),
    returning="run_id",
    lock_in_key_order=True,
)
# and the jobs of schedule runs, each settlement setting only what it changes.
SETTLE_JOBS = BulkUpdate(
    "settle_jobs",
    jobs,
    _FENCED_JOB,
    (
        "attempt",
        "leased_until",
        "misfire_exempt",
        "next_run_at",
        "nominal_at",
        "skipped_after",
        "skipped_through",
        "state",
    ),
    ("updated_at", "lease_token"),
)

STATEMENTS: tuple[BulkUpdate | BulkInsert | BulkLeasedInsert, ...] = (
    INSERT_RUNS,
    INSERT_NEW_JOBS,
    CLAIM_JOBS,
    PASS_JOBS,
    MOVE_JOBS,
    START_NEW_RUNS,
    START_RUNS,
    HEARTBEAT_RUNS,
    FINISH_RUNS,
    EXPIRE_RUNS,
    SETTLE_JOBS,
)
