"""Labels and keys on jobs.

jobs.labels holds a job's string pairs; on PostgreSQL a GIN index (jsonb_path_ops)
serves the containment test of a selector (`labels @> '{"team": "billing"}'`).
jobs.job_key is the client's name of a declarative job (`PUT /jobs/by-key/{key}`),
indexed per owner where set; jobs.rescheduled_at is when the schedule last changed.
The new columns are null or a constant default, so adding them rewrites nothing;
building the indexes locks writes to jobs for as long as it takes.

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
