"""Labels, keys and the overlap policy on jobs; backfill runs; the owner switch.

jobs.labels holds a job's string pairs; on PostgreSQL a GIN index (jsonb_path_ops)
serves the containment test of a selector (`labels @> '{"team": "billing"}'`).
jobs.job_key is the client's name of a declarative job (`PUT /jobs/by-key/{key}`),
indexed per owner where set; jobs.rescheduled_at is when the schedule last changed.
The new columns are null or a constant default, so adding them rewrites nothing;
building the indexes locks writes to jobs for as long as it takes.

runs.origin may be 'backfill' too. On PostgreSQL the wider check is added NOT VALID:
every existing row met the narrower one, and validating would hold the runs table's
write lock for a scan of the whole history. SQLite rebuilds the table (batch mode).

owners.paused_at is set while `punctual owners pause` holds an owner's runs.
jobs.overlap is each job's overlap policy; every existing job keeps what it did
(`buffer_one`, a constant default: nothing is rewritten).

Revision ID: 0009
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

from app.registry.schema import JSONType, UTCDateTime

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("jobs", sa.Column("labels", JSONType, nullable=False, server_default=sa.text("'{}'")))
    if postgres:
        op.create_index(
            "ix_jobs_labels",
            "jobs",
            ["labels"],
            postgresql_using="gin",
            postgresql_ops={"labels": "jsonb_path_ops"},
        )
    op.add_column("jobs", sa.Column("job_key", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("rescheduled_at", UTCDateTime(), nullable=True))
    keyed = sa.text("job_key IS NOT NULL")
    op.create_index(
        "ix_jobs_owner_key", "jobs", ["owner", "job_key"], postgresql_where=keyed, sqlite_where=keyed
    )
    _widen_run_origins(postgres)
    op.add_column("owners", sa.Column("paused_at", UTCDateTime(), nullable=True))
    op.add_column("jobs", sa.Column("overlap", sa.Text(), nullable=False, server_default="buffer_one"))


ORIGINS = "origin IN ('schedule', 'trigger', 'replay', 'backfill')"
# 0001 named the check `ck_runs_origin` and the metadata's naming convention prefixed it
# again: this is its name in every registry (and batch mode's on SQLite).


def _widen_run_origins(postgres: bool) -> None:
    if postgres:
        op.execute(
            "ALTER TABLE runs DROP CONSTRAINT ck_runs_ck_runs_origin,"
            f" ADD CONSTRAINT ck_runs_ck_runs_origin CHECK ({ORIGINS}) NOT VALID"
        )
        return
    with op.batch_alter_table("runs", recreate="always") as batch:
        batch.drop_constraint("ck_runs_origin", type_="check")
        batch.create_check_constraint("ck_runs_origin", sa.text(ORIGINS))
