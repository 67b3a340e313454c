"""`postgres` targets: one inbox row per occurrence, in the target's own database.

A target `{"type": "postgres", "database": "billing"}` names an alias of
PUNCTUAL_TARGET_DATABASES; the operator grants it to owners
(PUNCTUAL_TARGET_DATABASE_OWNERS), and a DSN never comes from an owner. An attempt
is one transaction there:

    INSERT INTO punctual_inbox (idempotency_key, job_id, owner, scheduled_for, attempt, payload)
    VALUES (...) ON CONFLICT (idempotency_key) DO NOTHING

and success is its commit. The key is the occurrence's Idempotency-Key
(`<job_id>:<scheduled_for>`), the same on every retry, redelivery, lease expiry and
replay, so however often an occurrence is attempted, the inbox holds one row for it.
A commit whose answer was lost is attempted again and inserts nothing. The
receiving application consumes the rows in its own transactions
(punctual_client.inbox; docs/api.md "Postgres targets"). `punctual targets init
ALIAS` creates the table (INBOX_DDL).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from app.core.delivery import encode_payload, idempotency_key
from app.core.retries import CallOutcome
from app.registry.engines import create_engine_for
from app.settings import Settings

__all__ = ["INBOX_DDL", "InboxCall", "InboxWriter"]

INBOX_DDL = (
    """CREATE TABLE IF NOT EXISTS punctual_inbox (
    idempotency_key text PRIMARY KEY,
    job_id uuid NOT NULL,
    owner text NOT NULL,
    scheduled_for timestamptz NOT NULL,
    attempt integer NOT NULL,
    payload jsonb,
    inserted_at timestamptz NOT NULL DEFAULT now(),
    done_at timestamptz
)""",
    "CREATE INDEX IF NOT EXISTS punctual_inbox_pending ON punctual_inbox (inserted_at) WHERE done_at IS NULL",
)

_INSERT = sa.text(
    "INSERT INTO punctual_inbox (idempotency_key, job_id, owner, scheduled_for, attempt, payload) "
    "VALUES (:key, :job_id, :owner, :scheduled_for, :attempt, CAST(:payload AS jsonb)) "
    "ON CONFLICT (idempotency_key) DO NOTHING"
)


@dataclass(frozen=True)
class InboxCall:
    """One attempt of one run against a postgres target."""

    job_id: str
    owner: str
    scheduled_for: datetime
    attempt: int
    database: str  # the alias
    payload: Any


class InboxWriter:
    """Writes inbox rows; one small connection pool per target database, made on first use."""

    def __init__(self, settings: Settings, pool_size: int = 4):
        self.settings = settings
        self.pool_size = pool_size
        self._engines: dict[str, sa.Engine] = {}
        self._lock = threading.Lock()

    def _engine(self, alias: str) -> sa.Engine | None:
        database = self.settings.target_database(alias)
        if database is None:
            return None
        with self._lock:
            engine = self._engines.get(alias)
            if engine is None:
                engine = self._engines[alias] = create_engine_for(database.dsn, self.pool_size)
            return engine

    def write(self, call: InboxCall) -> CallOutcome:
        """Insert the occurrence's row (or find it there) and commit; never raises."""
        database = self.settings.target_database(call.database)
        if database is None or not database.granted(call.owner):
            # Checked again here: the settings may have changed since the job was created.
            return CallOutcome(
                error=f"target database {call.database!r} is not granted to owner {call.owner!r}",
                retryable_error=False,
            )
        try:
            payload = encode_payload(call.payload).decode("utf-8")
        except (TypeError, ValueError) as exc:
            return CallOutcome(error=f"cannot encode the payload: {exc}", retryable_error=False)
        engine = self._engine(call.database)
        assert engine is not None
        try:
            with engine.begin() as conn:
                conn.execute(
                    _INSERT,
                    {
                        "key": idempotency_key(call.job_id, call.scheduled_for),
                        "job_id": call.job_id,
                        "owner": call.owner,
                        "scheduled_for": call.scheduled_for,
                        "attempt": call.attempt,
                        "payload": payload,
                    },
                )
        except sa.exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            first = (str(cause).strip().splitlines() or [""])[0]
            if "punctual_inbox" in first and "does not exist" in first:
                first += f" (run `punctual targets init {call.database}`)"
            return CallOutcome(
                error=f"inbox write to {call.database!r} failed: {type(cause).__name__}: {first}"
            )
        return CallOutcome(status_code=None)

    def close(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()


def init_inbox(dsn: str) -> None:
    """Create the inbox table and its index (idempotent): `punctual targets init`."""
    engine = create_engine_for(dsn, 1)
    try:
        with engine.begin() as conn:
            for statement in INBOX_DDL:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


_writers: dict[Settings, InboxWriter] = {}
_writers_lock = threading.Lock()


def inbox_writer(settings: Settings) -> InboxWriter:
    """The process's writer for these settings (its pools are reused by every attempt)."""
    with _writers_lock:
        writer = _writers.get(settings)
        if writer is None:
            writer = _writers[settings] = InboxWriter(settings)
        return writer


def attempt(settings: Settings, run: Any) -> CallOutcome:
    """The dispatch path's hook (app.worker.engine): one attempt of a postgres target's run."""
    return inbox_writer(settings).write(
        InboxCall(
            str(run.job_id),
            run.owner,
            run.scheduled_for,
            run.attempt,
            run.target.get("database"),
            run.payload,
        )
    )
