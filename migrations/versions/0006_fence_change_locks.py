"""A move's tracked change keeps its key locked until it commits; a stale write is refused.

Migration 0004's fence triggers record the key of each changed row of a `tracking`
shard with INSERT ... ON CONFLICT DO NOTHING. When the key was recorded already, a
later change of the same row took no lock on it, so the mover could take the key and
read the row while that change was still uncommitted: it copied the row as it was
before the change, and the change, committed afterwards, was never recorded again.
The new database kept the old row (a run still `claimed` or `running` there, which
its completion then found stale and the janitor fired again: one occurrence called
twice).

Now the trigger locks the key (ON CONFLICT DO UPDATE ... WHERE false locks the row
without writing it) until its transaction ends, and the mover takes keys FOR UPDATE
SKIP LOCKED: a key whose change is not committed yet is left for a later round, and a
change that meets a key the mover holds waits for the mover, then records it anew.

`punctual_refuse_fenced(shards)` is the same refusal for a worker's write that
finds no row to change: a process whose map is a moment old may send a start, a
heartbeat or a completion to a move's source after the move deleted the shard's rows
there, and an UPDATE that changes nothing fires no refusal. The worker's writes call
it first in their transaction (app.registry.engines.refuse_moved_shards). It takes a
transaction id before it looks, so a move that fences one of the shards right after
the look waits for that transaction (the mover waits for every transaction holding
one) and its writes meet the rows, and the trigger, still there.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# (table, key column): the rows a move copies.
MOVED_TABLES = (("jobs", "job_id"), ("runs", "run_id"))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, key in MOVED_TABLES:
            op.execute(fence_function(table, key))
        op.execute(REFUSE_FENCED)


REFUSE_FENCED = """
CREATE OR REPLACE FUNCTION punctual_refuse_fenced(shards smallint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    refused smallint;
BEGIN
    PERFORM txid_current();
    SELECT f.shard INTO refused FROM shard_fences f WHERE f.shard = ANY(shards) AND f.mode = 'fenced' LIMIT 1;
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION 'punctual: shard % is being moved; this database no longer takes its writes', refused
            USING ERRCODE = 'PT409';
    END IF;
END $$
"""


def fence_function(table: str, key: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION punctual_fence_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
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
        ON CONFLICT (table_name, row_key) DO UPDATE SET shard = EXCLUDED.shard WHERE false;
    RETURN NULL;
END $$
"""
