"""The registry schema: SQLAlchemy Core metadata for jobs, runs and owners.

The same metadata runs on PostgreSQL (production, sharded) and SQLite (the embedded
default of `punctual dev`). Migrations in migrations/ must produce exactly this; a
test compares them.

jobs is the schedule cursor: `next_run_at` (the jittered fire instant) and
`nominal_at` (the occurrence it stands for) say what is due next. A claim sets
state 'running' with a fresh `lease_token`; every later write to the job is fenced
by that token, so a stale worker's completion changes nothing. Pause and cancel
while a run is in flight change `state` but keep the lease: the run finishes, and
its completion leaves the job paused or cancelled.

runs is the history and the outbox in one: a claim inserts one row per run with
`published` false; the relay publishes it and sets `published`. Runs triggered,
replayed or backfilled off-schedule carry their own lease (`origin` 'trigger',
'replay' or 'backfill') and their retries are new rows with a later `due_at`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator):
    """An aware UTC datetime on both dialects.

    PostgreSQL keeps timestamptz; SQLite has no time zones, so instants are stored
    as naive UTC (whose text form sorts like time, which the due-range scan needs)
    and made aware again on the way out. Naive input is a bug and is refused.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the registry; instants must be aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

JOB_STATES = ("scheduled", "running", "paused", "completed", "cancelled", "dead")
RUN_STATES = ("claimed", "running", "succeeded", "failed", "dead", "skipped", "replayed")
RUN_ORIGINS = ("schedule", "trigger", "replay", "backfill")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("job_id", sa.Uuid(), primary_key=True),
    sa.Column("shard", sa.SmallInteger(), nullable=False),
    sa.Column("owner", sa.Text(), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("target", JSONType, nullable=False),
    sa.Column("payload", JSONType, nullable=True),
    # The schedule as columns, so operators can query it; the pure core reads them back.
    sa.Column("schedule_kind", sa.Text(), nullable=False),  # once | cron | interval
    sa.Column("run_at", UTCDateTime(), nullable=True),
    sa.Column("cron", sa.Text(), nullable=True),
    sa.Column("interval_s", sa.Integer(), nullable=True),
    sa.Column("timezone", sa.Text(), nullable=False, server_default="UTC"),
    sa.Column("start_at", UTCDateTime(), nullable=True),
    sa.Column("end_at", UTCDateTime(), nullable=True),
    sa.Column("retry_max_attempts", sa.Integer(), nullable=False),
    sa.Column("retry_backoff_s", sa.Float(), nullable=False),
    sa.Column("retry_max_backoff_s", sa.Float(), nullable=False),
    sa.Column("misfire", sa.Text(), nullable=False),
    sa.Column("dst_gap", sa.Text(), nullable=False),
    sa.Column("dst_overlap", sa.Text(), nullable=False),
    sa.Column("jitter_s", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column(
        "next_run_at", UTCDateTime(), nullable=True
    ),  # jittered fire instant; null when nothing is due any more
    sa.Column("nominal_at", UTCDateTime(), nullable=True),  # the occurrence next_run_at stands for
    sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),  # attempts spent on nominal_at
    # next_run_at is a retry, a run held back by a limit, or a replay: never a misfire.
    sa.Column("misfire_exempt", sa.Boolean(), nullable=False, server_default=sa.false()),
    # run_all's cap: occurrences in (skipped_after, skipped_through] were recorded skipped.
    sa.Column("skipped_after", UTCDateTime(), nullable=True),
    sa.Column("skipped_through", UTCDateTime(), nullable=True),
    sa.Column("lease_token", sa.Uuid(), nullable=True),
    sa.Column("leased_until", UTCDateTime(), nullable=True),
    sa.Column("idempotency_key", sa.Text(), nullable=True),
    sa.Column("request_hash", sa.Text(), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    # The owner's string pairs (app.core.labels): `GET /jobs?label=k:v`, the label verbs.
    sa.Column("labels", JSONType, nullable=False, server_default=sa.text("'{}'")),
    # The client's own name for a declarative job (`PUT /jobs/by-key/{key}`); its job_id is
    # uuid5(owner, key), so the primary key keeps it unique per owner across databases.
    sa.Column("job_key", sa.Text(), nullable=True),
    # When the schedule, dst or jitter last changed: the next occurrence is computed
    # strictly after it even by a run in flight then (app.lifecycle.cursor.advance).
    sa.Column("rescheduled_at", UTCDateTime(), nullable=True),
    # What an occurrence due while a run is in flight does (app.core.overlap).
    sa.Column("overlap", sa.Text(), nullable=False, server_default="buffer_one"),
    sa.CheckConstraint(sa.column("state").in_(JOB_STATES), name="state"),
)

# "What is due" is a short range scan: only scheduled rows are in this index. The bound
# on next_run_at holds for every row; it is there so that only a query stating it
# (app.pollers.claim.due_jobs) can use this index, and the fair claim's per-owner probe
# never does, even where the planner has no statistics (migration 0007).
DUE_INDEX_BOUND = datetime(1, 1, 1, tzinfo=UTC)
sa.Index(
    "ix_jobs_due",
    jobs.c.shard,
    jobs.c.next_run_at,
    postgresql_where=sa.text("state = 'scheduled' AND next_run_at > '0001-01-01 00:00:00+00'"),
    sqlite_where=jobs.c.state == "scheduled",
)
# "What is due, owner by owner": the fair claim (app.pollers.claim) probes this once per
# owner of the shard, then takes each owner's share of the batch as a range of it.
sa.Index(
    "ix_jobs_due_by_owner",
    jobs.c.shard,
    jobs.c.owner,
    jobs.c.next_run_at,
    postgresql_where=jobs.c.state == "scheduled",
    sqlite_where=jobs.c.state == "scheduled",
)
# "Whose lease expired": only rows holding a lease (running, or paused/cancelled in flight).
sa.Index(
    "ix_jobs_leased",
    jobs.c.shard,
    jobs.c.leased_until,
    postgresql_where=jobs.c.lease_token.isnot(None),
    sqlite_where=jobs.c.lease_token.isnot(None),
)
# "Which jobs carry these labels" (containment, `labels @> '{"team": "billing"}'`): on
# PostgreSQL only; the embedded SQLite registry filters the owner's rows instead.
sa.Index(
    "ix_jobs_labels",
    jobs.c.labels,
    postgresql_using="gin",
    postgresql_ops={"labels": "jsonb_path_ops"},
).ddl_if(dialect="postgresql")
# The owner's declarative jobs (`punctual apply`, `GET /jobs?keyed=true`).
sa.Index(
    "ix_jobs_owner_key",
    jobs.c.owner,
    jobs.c.job_key,
    postgresql_where=jobs.c.job_key.isnot(None),
    sqlite_where=jobs.c.job_key.isnot(None),
)
# Listing, newest first, per owner; and the exact-name filter.
sa.Index("ix_jobs_owner_created", jobs.c.owner, jobs.c.created_at, jobs.c.job_id)
sa.Index("ix_jobs_owner_name", jobs.c.owner, jobs.c.name, jobs.c.created_at, jobs.c.job_id)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.Uuid(), primary_key=True),
    sa.Column("job_id", sa.Uuid(), nullable=False),
    sa.Column("shard", sa.SmallInteger(), nullable=False),
    sa.Column("owner", sa.Text(), nullable=False),
    sa.Column("origin", sa.Text(), nullable=False, server_default="schedule"),
    sa.Column(
        "scheduled_for", UTCDateTime(), nullable=False
    ),  # nominal occurrence: the idempotency key's time
    sa.Column("attempt", sa.Integer(), nullable=False),  # 1-based
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column("lease_token", sa.Uuid(), nullable=True),
    sa.Column("leased_until", UTCDateTime(), nullable=True),
    # Outbox: when the relay sweep publishes it if nobody did (a claim publishes at once).
    sa.Column("due_at", UTCDateTime(), nullable=True),
    sa.Column("published", sa.Boolean(), nullable=False, server_default=sa.false()),
    # What this occurrence was claimed with: PATCH during a run does not change it.
    sa.Column("target", JSONType, nullable=True),
    sa.Column("retry", JSONType, nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("lateness_ms", sa.BigInteger(), nullable=True),
    sa.Column("status_code", sa.Integer(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint(sa.column("state").in_(RUN_STATES), name="state"),
    sa.CheckConstraint(sa.column("origin").in_(RUN_ORIGINS), name="origin"),
)

sa.Index("ix_runs_job_created", runs.c.job_id, runs.c.created_at, runs.c.run_id)
sa.Index(
    "ix_runs_outbox",
    runs.c.shard,
    runs.c.due_at,
    postgresql_where=runs.c.published == sa.false(),
    sqlite_where=runs.c.published == sa.false(),
)
# Off-schedule runs (trigger, replay, backfill) hold their own lease; the janitor scans these.
sa.Index(
    "ix_runs_leased",
    runs.c.shard,
    runs.c.leased_until,
    postgresql_where=runs.c.state.in_(("claimed", "running")),
    sqlite_where=runs.c.state.in_(("claimed", "running")),
)
# Retention (app.pollers.retention) deletes the oldest finished runs of a shard first.
sa.Index(
    "ix_runs_finished",
    runs.c.shard,
    runs.c.finished_at,
    postgresql_where=runs.c.finished_at.isnot(None),
    sqlite_where=runs.c.finished_at.isnot(None),
)
sa.Index(
    "ix_runs_dead",
    runs.c.owner,
    runs.c.created_at,
    runs.c.run_id,
    postgresql_where=runs.c.state == "dead",
    sqlite_where=runs.c.state == "dead",
)

# Owners and keys live on the home database (the shard map names it: app.registry.shard_map).
owners = sa.Table(
    "owners",
    metadata,
    sa.Column("owner", sa.Text(), primary_key=True),
    sa.Column("signing_secret", sa.Text(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    # `punctual keys rotate`: the secret before, which signs too until previous_secret_until.
    sa.Column("previous_signing_secret", sa.Text(), nullable=True),
    sa.Column("previous_secret_until", UTCDateTime(), nullable=True),
    # The owner's share of each claim batch relative to the other owners with due rows
    # (app.pollers.shares); `punctual owners set OWNER --weight N`.
    sa.Column("weight", sa.Integer(), nullable=False, server_default="1"),
    # `punctual owners pause OWNER`: while set, none of the owner's runs starts
    # (app.services.owners: the claim, the relay sweep and the janitor pass them by).
    sa.Column("paused_at", UTCDateTime(), nullable=True),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column(
        "key_hash", sa.Text(), primary_key=True
    ),  # sha256 hex of the key; the key itself is never stored
    sa.Column("owner", sa.Text(), sa.ForeignKey("owners.owner"), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("revoked_at", UTCDateTime(), nullable=True),  # `punctual keys revoke`; the row stays listed
)

# The limits of a named limits key: those of the job most recently created or
# updated with it (docs/api.md "Limits"). On the home DSN, like owners.
limit_keys = sa.Table(
    "limit_keys",
    metadata,
    sa.Column("owner", sa.Text(), primary_key=True),
    sa.Column("name", sa.Text(), primary_key=True),
    sa.Column("rate_per_s", sa.Float(), nullable=True),
    sa.Column("max_concurrency", sa.Integer(), nullable=True),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
)

# --- the shard map (app.registry.shard_map) and moves (app.registry.mover) -----------

# Every database's identity: one row. The home's id names where owners and the map live.
punctual_database = sa.Table(
    "punctual_database",
    metadata,
    sa.Column("database_id", sa.Uuid(), primary_key=True),
    sa.Column("cluster_id", sa.Uuid(), nullable=False),
    sa.Column("home_id", sa.Uuid(), nullable=False),
    # Its place in PUNCTUAL_DATABASE_URLS when it was stamped.
    sa.Column("created_index", sa.Integer(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
)

# On the home database only: the cluster, and the map's version (bumped by every change).
punctual_cluster = sa.Table(
    "punctual_cluster",
    metadata,
    sa.Column("cluster_id", sa.Uuid(), primary_key=True),
    sa.Column("home_id", sa.Uuid(), nullable=False),
    sa.Column("map_version", sa.BigInteger(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
)

# On the home database only: every database of the cluster and its place in the list
# when it was stamped, so a process that starts while one is unreachable still knows
# which DSN stands for which database.
cluster_databases = sa.Table(
    "cluster_databases",
    metadata,
    sa.Column("database_id", sa.Uuid(), primary_key=True),
    sa.Column("created_index", sa.Integer(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
)

MOVE_STEPS = ("copying", "fenced", "switched")  # app.registry.mover

# On the home database only: logical shard -> the database serving it, and a move in progress.
shard_map = sa.Table(
    "shard_map",
    metadata,
    sa.Column("shard", sa.SmallInteger(), primary_key=True, autoincrement=False),
    sa.Column("database_id", sa.Uuid(), nullable=False),
    sa.Column("move_peer", sa.Uuid(), nullable=True),  # the move's target before the switch, its source after
    sa.Column("move_step", sa.Text(), nullable=True),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint(sa.column("move_step").in_(MOVE_STEPS), name="move_step"),
)

# On every database, written by a move: writes to a `fenced` shard's rows are refused
# (a trigger), and keys of a `tracking` shard's changed rows are kept in shard_changes.
shard_fences = sa.Table(
    "shard_fences",
    metadata,
    sa.Column("shard", sa.SmallInteger(), primary_key=True, autoincrement=False),
    sa.Column("mode", sa.Text(), nullable=False),
    sa.CheckConstraint(sa.column("mode").in_(("tracking", "fenced")), name="mode"),
)

shard_changes = sa.Table(
    "shard_changes",
    metadata,
    sa.Column("table_name", sa.Text(), primary_key=True),
    sa.Column("row_key", sa.Uuid(), primary_key=True),
    sa.Column("shard", sa.SmallInteger(), nullable=False),
)
sa.Index("ix_shard_changes_shard", shard_changes.c.shard, shard_changes.c.table_name)


def claimed_without_row() -> sa.ColumnElement[bool]:
    """A job whose lease is held by a run claimed and not started yet: such a run has
    no row until its start (app.pollers.claim), so counts of runs waiting read it here."""
    return sa.and_(
        jobs.c.lease_token.isnot(None),
        ~sa.exists().where(runs.c.job_id == jobs.c.job_id, runs.c.lease_token == jobs.c.lease_token),
    )
