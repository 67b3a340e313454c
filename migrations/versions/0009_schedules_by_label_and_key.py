"""Labels on jobs.

jobs.labels holds a job's string pairs; on PostgreSQL a GIN index (jsonb_path_ops)
serves the containment test of a selector (`labels @> '{"team": "billing"}'`). The
column has a constant default, so adding it rewrites nothing; building the index
locks writes to jobs for as long as it takes.

Revision ID: 0009
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

from app.registry.schema import JSONType

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
