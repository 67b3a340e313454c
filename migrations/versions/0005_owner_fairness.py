"""Fair claiming between owners: the due index by owner, and each owner's weight.

ix_jobs_due_by_owner (shard, owner, next_run_at) WHERE state = 'scheduled' is what the
fair claim probes once per owner (app.pollers.claim). Building it locks writes to
jobs for as long as it takes (about a second per million scheduled rows here); the
weight column has a constant default, so adding it rewrites nothing.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    scheduled = sa.text("state = 'scheduled'")
    op.create_index(
        "ix_jobs_due_by_owner",
        "jobs",
        ["shard", "owner", "next_run_at"],
        postgresql_where=scheduled,
        sqlite_where=scheduled,
    )
    op.add_column("owners", sa.Column("weight", sa.Integer(), server_default="1", nullable=False))
