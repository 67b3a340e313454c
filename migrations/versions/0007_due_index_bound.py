"""The plain due index takes only the queries that ask for it: ix_jobs_due gains the
bound `next_run_at > '0001-01-01'`, which every scheduled row satisfies.

The fair claim probes each owner's share with `owner = :o AND next_run_at <= :h`, which
ix_jobs_due (shard, next_run_at) WHERE state = 'scheduled' could also serve, filtering
by owner. Where the planner had no statistics (a database filled since `punctual
migrate` created its indexes empty, before any ANALYZE) both partial indexes looked
empty, it took ix_jobs_due, and each probe read the shard's whole due range: a batch of
500 owners took 0.2-3 s instead of about 2 ms. With the bound in its predicate,
ix_jobs_due is only usable by a query that states the same bound (`due_jobs`, the
oldest-first claim); `next_run_at <= :h` does not imply it, so the fair claim can only
probe ix_jobs_due_by_owner, whatever the statistics say.

Rebuilding the index locks writes to jobs for as long as it takes (about a second per
million scheduled rows on the 2-core box). SQLite keeps its index as it was: its
planner picks by the query's columns, and the embedded registry has one poller.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_jobs_due", table_name="jobs")
    op.create_index(
        "ix_jobs_due",
        "jobs",
        ["shard", "next_run_at"],
        postgresql_where=sa.text("state = 'scheduled' AND next_run_at > '0001-01-01 00:00:00+00'"),
    )
