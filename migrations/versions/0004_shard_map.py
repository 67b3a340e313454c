"""The shard map and moves: database identity, the map, shard fences; run retention's index.

The rows (identities, the map) are written by `punctual migrate` after the schema
(app.registry.shard_map.establish): a migration runs per database and cannot know
its place in PUNCTUAL_DATABASE_URLS.

On PostgreSQL, statement triggers on jobs and runs enforce a move's fence in the
database itself, whatever a process's cached map says: a write touching a shard
that this database has `fenced` fails with SQLSTATE PT409, and the keys of rows of
a `tracking` shard that change are kept in shard_changes for the move's delta
copy. With no fence on the database (always, but during a move) a trigger costs
one probe of an empty table per statement. The mover's own writes set
`punctual.mover` and pass.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from app.registry.schema import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# (table, key column): the rows a move copies.
MOVED_TABLES = (("jobs", "job_id"), ("runs", "run_id"))


def upgrade() -> None:
    op.create_table(
        "punctual_database",
        sa.Column("database_id", sa.Uuid(), nullable=False),
        sa.Column("cluster_id", sa.Uuid(), nullable=False),
        sa.Column("home_id", sa.Uuid(), nullable=False),
        sa.Column("created_index", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("database_id", name="pk_punctual_database"),
    )
    op.create_table(
        "punctual_cluster",
        sa.Column("cluster_id", sa.Uuid(), nullable=False),
        sa.Column("home_id", sa.Uuid(), nullable=False),
        sa.Column("map_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("cluster_id", name="pk_punctual_cluster"),
    )
    op.create_table(
        "cluster_databases",
        sa.Column("database_id", sa.Uuid(), nullable=False),
        sa.Column("created_index", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("database_id", name="pk_cluster_databases"),
    )
    op.create_table(
        "shard_map",
        sa.Column("shard", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("database_id", sa.Uuid(), nullable=False),
        sa.Column("move_peer", sa.Uuid(), nullable=True),
        sa.Column("move_step", sa.Text(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("move_step IN ('copying', 'fenced', 'switched')", name="ck_shard_map_move_step"),
        sa.PrimaryKeyConstraint("shard", name="pk_shard_map"),
    )
    op.create_table(
        "shard_fences",
        sa.Column("shard", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.CheckConstraint("mode IN ('tracking', 'fenced')", name="ck_shard_fences_mode"),
        sa.PrimaryKeyConstraint("shard", name="pk_shard_fences"),
    )
    op.create_table(
        "shard_changes",
        sa.Column("table_name", sa.Text(), nullable=False),
        sa.Column("row_key", sa.Uuid(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("table_name", "row_key", name="pk_shard_changes"),
    )
    op.create_index("ix_shard_changes_shard", "shard_changes", ["shard", "table_name"])
    finished = sa.text("finished_at IS NOT NULL")
    op.create_index(
        "ix_runs_finished", "runs", ["shard", "finished_at"], postgresql_where=finished, sqlite_where=finished
    )
    if op.get_bind().dialect.name == "postgresql":
        for statement in fence_triggers():
            op.execute(statement)


def fence_triggers() -> list[str]:
    """The functions and triggers of the fence."""
    statements = []
    for table, key in MOVED_TABLES:
        statements.append(_fence_function(table, key))
        for event, transition in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            statements.append(
                f"CREATE TRIGGER {table}_fence_{event.lower()} AFTER {event} ON {table} "
                f"REFERENCING {transition} TABLE AS changed FOR EACH STATEMENT "
                f"EXECUTE FUNCTION punctual_fence_{table}()"
            )
    return statements


def drop_fence_triggers() -> list[str]:
    return [f"DROP FUNCTION IF EXISTS punctual_fence_{table}() CASCADE" for table, _key in MOVED_TABLES]


def _fence_function(table: str, key: str) -> str:
    return f"""
CREATE FUNCTION punctual_fence_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    refused smallint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM shard_fences) THEN
        RETURN NULL;
    END IF;
    IF coalesce(current_setting('punctual.mover', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT c.shard INTO refused FROM changed c JOIN shard_fences f ON f.shard = c.shard AND f.mode = 'fenced'
        LIMIT 1;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'punctual: shard % is being moved; this database no longer takes its writes', refused
            USING ERRCODE = 'PT409';
    END IF;
    INSERT INTO shard_changes (table_name, row_key, shard)
        SELECT DISTINCT '{table}', c.{key}, c.shard FROM changed c
        JOIN shard_fences f ON f.shard = c.shard AND f.mode = 'tracking'
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$
"""
