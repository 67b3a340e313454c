"""Which failures are retried in place, and the bounded retry (app.registry.transient)."""

from __future__ import annotations

import pytest
import sqlalchemy.exc as sa_exc

from app.registry.transient import FIRST_PAUSE_S, MAX_PAUSE_S, is_transient, retrying


class _Clock:
    def __init__(self):
        self.now = 0.0
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def operational(message: str = "terminating connection due to administrator command"):
    return sa_exc.OperationalError("UPDATE runs ...", {}, Exception(message))


def test_connection_failures_of_the_database_broker_and_redis_are_transient():
    import kombu.exceptions
    import redis.exceptions

    assert is_transient(operational())
    assert is_transient(sa_exc.InterfaceError("SELECT 1", {}, Exception("connection already closed")))
    invalidated = sa_exc.DBAPIError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    )
    assert is_transient(invalidated)
    assert is_transient(sa_exc.TimeoutError("QueuePool limit reached"))
    assert is_transient(kombu.exceptions.OperationalError("connection refused"))
    assert is_transient(redis.exceptions.ConnectionError("Connection closed by server."))
    assert is_transient(ConnectionResetError())


def test_a_shard_map_no_database_answers_for_is_transient():
    # A process's first read of the map meets the registry away: its dispatch message
    # goes back to the broker instead of being acknowledged with its runs unstarted.
    from app.registry.shard_map import MapUnavailable, ShardMapError

    assert is_transient(MapUnavailable("no database in PUNCTUAL_DATABASE_URLS answers"))
    assert not is_transient(ShardMapError("PUNCTUAL_DATABASE_URLS[1] is not a migrated Punctual database"))


def test_errors_that_would_fail_again_are_not_transient():
    assert not is_transient(sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_transient(sa_exc.ProgrammingError("SELECT", {}, Exception("syntax error")))
    assert not is_transient(ValueError("bad"))
    assert not is_transient(KeyError("x"))


def test_a_write_that_meets_a_cut_is_sent_again_with_a_doubling_pause():
    clock, tries = _Clock(), []

    def write():
        tries.append(clock.now)
        if len(tries) < 4:
            raise operational()
        return "written"

    assert retrying(write, "a write", sleep=clock.sleep, clock=clock) == "written"
    assert clock.pauses == [FIRST_PAUSE_S, FIRST_PAUSE_S * 2, FIRST_PAUSE_S * 4]


def test_the_pause_stops_growing_and_the_budget_ends_it_with_the_last_failure():
    clock = _Clock()

    def never():
        raise operational("the database system is shutting down")

    with pytest.raises(sa_exc.OperationalError, match="shutting down"):
        retrying(never, "a write", budget_s=12.0, sleep=clock.sleep, clock=clock)
    assert max(clock.pauses) == MAX_PAUSE_S and clock.pauses[:3] == [0.1, 0.2, 0.4]
    assert sum(clock.pauses) <= 12.0 and sum(clock.pauses) > 12.0 - MAX_PAUSE_S


def test_a_failure_that_is_not_transient_is_raised_at_once():
    clock = _Clock()

    def broken():
        raise sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    with pytest.raises(sa_exc.IntegrityError):
        retrying(broken, "a write", sleep=clock.sleep, clock=clock)
    assert clock.pauses == []


def test_a_dispatch_that_finds_no_database_for_the_shard_map_gives_its_message_back(monkeypatch):
    # A worker process that had not read the map before the registry went away: its
    # message is rejected with requeue, not acknowledged with its runs unstarted.
    from celery.exceptions import Reject

    from app.registry.shard_map import MapUnavailable
    from app.tasks import dispatch as task

    class _Dispatcher:
        def dispatch(self, batch):
            raise MapUnavailable("no database in PUNCTUAL_DATABASE_URLS answers")

    class _Context:
        dispatcher = _Dispatcher()

    monkeypatch.setattr(task, "get_context", lambda: _Context())
    with pytest.raises(Reject) as rejected:
        task.dispatch.run(shard=3, runs="[]")
    assert rejected.value.requeue
