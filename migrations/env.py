"""Alembic environment: `punctual migrate` hands us an open connection per DSN."""

from __future__ import annotations

from alembic import context

from app.registry.schema import metadata

connection = context.config.attributes["connection"]

if connection.dialect.name == "postgresql":
    # Two `punctual migrate` at once (compose restarts, two operators) queue here
    # instead of racing on CREATE TABLE.
    connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7710225)")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
