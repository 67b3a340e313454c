"""How a shard's poll or sweep tick ends when the registry does not answer
(app.tasks.shard._unless_fenced): one warning line and the next tick, not a traceback;
a failure that is not transient still raises."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy.exc as sa_exc

from app.registry.shard_map import MapUnavailable
from app.tasks.shard import _unless_fenced


class _Registry:
    def __init__(self, fenced=None, map_error: Exception | None = None):
        self.fenced = fenced
        self.map_error = map_error

    def shard_fenced(self, shard: int) -> bool:
        if self.map_error is not None:
            raise self.map_error
        return bool(self.fenced)

    def engine_for_shard(self, shard: int) -> str:
        return f"engine-{shard}"


def _failing(exc: Exception):
    def tick(engine):
        raise exc

    return tick


def test_a_tick_runs_on_the_shards_engine_unless_fenced():
    assert _unless_fenced(_Registry(), 3, lambda engine: {"ran on": engine}) == {"ran on": "engine-3"}
    assert _unless_fenced(_Registry(fenced=True), 3, _failing(AssertionError("ran"))) == {
        "shard": 3,
        "fenced": True,
    }


@pytest.mark.parametrize(
    "registry, tick",
    [
        # A process's first read of the shard map with no database answering.
        (_Registry(map_error=MapUnavailable("no database answered")), _failing(AssertionError("ran"))),
        # The claim's retries spent while the database refuses connections.
        (_Registry(), _failing(sa_exc.OperationalError("SELECT", {}, Exception("connection refused\nmore")))),
    ],
)
def test_a_registry_that_does_not_answer_ends_the_tick_with_one_line(registry, tick, caplog):
    with caplog.at_level(logging.WARNING, logger="punctual.poll"):
        assert _unless_fenced(registry, 7, tick) == {"shard": 7, "unreachable": True}
    [record] = [r for r in caplog.records if r.name == "punctual.poll"]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert record.getMessage().startswith("shard 7: the tick gave up")


def test_a_failure_that_is_not_transient_still_raises():
    with pytest.raises(sa_exc.IntegrityError):
        _unless_fenced(
            _Registry(), 7, _failing(sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
        )
    with pytest.raises(ZeroDivisionError):
        _unless_fenced(_Registry(), 7, _failing(ZeroDivisionError()))
