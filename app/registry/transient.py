"""Transient failures of the registry (and of the broker and Redis beside it), retried
where they happen.

A connection cut (pg_terminate_backend, a Postgres restart, a failover), a
deadlock or serialization failure, a broker or Redis connection that drops: each
costs a second or two, and the write that met it is safe to send again, because
every write Punctual makes is fenced or idempotent (a second start of a started run
starts nothing, a second completion is stale, a second publish is a duplicate
message whose start is fenced). So the worker and the pollers retry such a write
in place, with a short backoff (0.1 s doubling to 2 s) for a bounded time
(RETRY_BUDGET_S) instead of failing a whole task and leaving its runs to wait for a
lease.

What is never retried here: the call of a target. Retries of a call live in the
registry only (docs/design.md, invariant 3).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy.exc as sa_exc

from app.registry.shard_map import MapUnavailable

T = TypeVar("T")
log = logging.getLogger("punctual.transient")

FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 2.0
# Longer than a Postgres restart or a broker reconnect on this kind of box (3-5 s),
# well inside a lease: a write still failing after this is given up (a dispatch
# message goes back to the broker, a poll tick ends and the next one tries again).
RETRY_BUDGET_S = 12.0


def _broker_and_redis_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = []
    try:
        import kombu.exceptions

        errors.append(kombu.exceptions.OperationalError)
    except ImportError:  # the API process does not need the broker
        pass
    try:
        import amqp.exceptions

        errors.append(amqp.exceptions.ConnectionError)
    except ImportError:
        pass
    try:
        import redis.exceptions

        errors.extend([redis.exceptions.ConnectionError, redis.exceptions.TimeoutError])
    except ImportError:
        pass
    return tuple(errors)


_OTHER_TRANSIENT = _broker_and_redis_errors() + (ConnectionError, socket.timeout, TimeoutError)


def is_transient(exc: BaseException) -> bool:
    """True for a failure that a retry of the same write may not meet again.

    SQLAlchemy wraps the driver's errors: OperationalError is psycopg's connection
    failures, AdminShutdown, "the database system is shutting down / starting up",
    deadlocks and serialization failures; InterfaceError a connection already
    closed; `connection_invalidated` any error that also killed the connection;
    TimeoutError (the pool's) a pool exhausted for a moment. MapUnavailable is a
    process's first read of the shard map meeting no database that answers: the
    registry is away, as for a refused connection. Integrity and programming errors
    are not transient: sending them again fails again.
    """
    if isinstance(exc, MapUnavailable):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(
            exc, (sa_exc.OperationalError, sa_exc.InterfaceError)
        )
    if isinstance(exc, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True
    return isinstance(exc, _OTHER_TRANSIENT)


def retrying(
    operation: Callable[[], T],
    what: str,
    budget_s: float = RETRY_BUDGET_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`operation()`, sent again after each transient failure (0.1 s, 0.2 s, ... 2 s
    apart) until it succeeds or `budget_s` has passed; the last failure is raised,
    as is any failure that is not transient."""
    deadline = clock() + budget_s
    pause = FIRST_PAUSE_S
    failures = 0
    while True:
        try:
            result = operation()
        except Exception as exc:
            if not is_transient(exc) or clock() + pause > deadline:
                raise
            failures += 1
            if failures == 1:
                log.warning(
                    "%s failed (%s: %s); retrying for up to %gs",
                    what,
                    type(exc).__name__,
                    first_line(exc),
                    budget_s,
                )
            sleep(pause)
            pause = min(MAX_PAUSE_S, pause * 2)
            continue
        if failures:
            log.warning("%s succeeded after %d transient failure(s)", what, failures)
        return result


def first_line(exc: BaseException) -> str:
    """The first line of a failure's text, at most 200 characters: what a log line
    or a run's error says of it (SQLAlchemy's go on with the statement and its
    parameters; a target's may be anything)."""
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else ""
