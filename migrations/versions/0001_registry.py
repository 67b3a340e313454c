"""The registry: jobs, runs (history and outbox), owners and API keys.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from app.registry.schema import JSONType, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "owners",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("signing_secret", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name="pk_owners"),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["owner"], ["owners.owner"], name="fk_api_keys_owner_owners"),
        sa.PrimaryKeyConstraint("key_hash", name="pk_api_keys"),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("target", JSONType, nullable=False),
        sa.Column("payload", JSONType, nullable=True),
        sa.Column("schedule_kind", sa.Text(), nullable=False),
        sa.Column("run_at", UTCDateTime(), nullable=True),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("interval_s", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.Text(), server_default="UTC", nullable=False),
        sa.Column("start_at", UTCDateTime(), nullable=True),
        sa.Column("end_at", UTCDateTime(), nullable=True),
        sa.Column("retry_max_attempts", sa.Integer(), nullable=False),
        sa.Column("retry_backoff_s", sa.Float(), nullable=False),
        sa.Column("retry_max_backoff_s", sa.Float(), nullable=False),
        sa.Column("misfire", sa.Text(), nullable=False),
        sa.Column("dst_gap", sa.Text(), nullable=False),
        sa.Column("dst_overlap", sa.Text(), nullable=False),
        sa.Column("jitter_s", sa.Integer(), server_default="0", nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("next_run_at", UTCDateTime(), nullable=True),
        sa.Column("nominal_at", UTCDateTime(), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("misfire_exempt", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("skipped_after", UTCDateTime(), nullable=True),
        sa.Column("skipped_through", UTCDateTime(), nullable=True),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("leased_until", UTCDateTime(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("request_hash", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "state IN ('scheduled', 'running', 'paused', 'completed', 'cancelled', 'dead')",
            name="ck_jobs_state",
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_jobs"),
    )
    scheduled = sa.text("state = 'scheduled'")
    leased = sa.text("lease_token IS NOT NULL")
    op.create_index(
        "ix_jobs_due", "jobs", ["shard", "next_run_at"], postgresql_where=scheduled, sqlite_where=scheduled
    )
    op.create_index(
        "ix_jobs_leased", "jobs", ["shard", "leased_until"], postgresql_where=leased, sqlite_where=leased
    )
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at", "job_id"])
    op.create_index("ix_jobs_owner_name", "jobs", ["owner", "name", "created_at", "job_id"])

    op.create_table(
        "runs",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("origin", sa.Text(), server_default="schedule", nullable=False),
        sa.Column("scheduled_for", UTCDateTime(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("leased_until", UTCDateTime(), nullable=True),
        sa.Column("due_at", UTCDateTime(), nullable=True),
        sa.Column("published", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("target", JSONType, nullable=True),
        sa.Column("retry", JSONType, nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("lateness_ms", sa.BigInteger(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "state IN ('claimed', 'running', 'succeeded', 'failed', 'dead', 'skipped', 'replayed')",
            name="ck_runs_state",
        ),
        sa.CheckConstraint("origin IN ('schedule', 'trigger', 'replay')", name="ck_runs_origin"),
        sa.PrimaryKeyConstraint("run_id", name="pk_runs"),
    )
    unpublished = sa.text("published = false")
    in_flight = sa.text("state IN ('claimed', 'running')")
    dead = sa.text("state = 'dead'")
    op.create_index("ix_runs_job_created", "runs", ["job_id", "created_at", "run_id"])
    op.create_index(
        "ix_runs_outbox", "runs", ["shard", "due_at"], postgresql_where=unpublished, sqlite_where=unpublished
    )
    op.create_index(
        "ix_runs_leased",
        "runs",
        ["shard", "leased_until"],
        postgresql_where=in_flight,
        sqlite_where=in_flight,
    )
    op.create_index(
        "ix_runs_dead", "runs", ["owner", "created_at", "run_id"], postgresql_where=dead, sqlite_where=dead
    )
