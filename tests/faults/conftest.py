"""The fault tier: real processes on the machine's real Postgres, RabbitMQ and Redis,
one fault per test (tests/faults/harness.py runs it, verdict.py judges it).

A module gets fresh databases and a vhost (tests/conftest.py); each test gets a
fresh Redis prefix and its own owner, and empties the databases afterwards, so a
test's recurring jobs do not fire into the next one.
"""

from __future__ import annotations

import pytest

from tests.conftest import REDIS_URL
from tests.faults.harness import FaultStack, fault_env

# The fault stacks run PUNCTUAL_SHARDS=4 (harness.fault_env): their cluster is made so.
FAULT_SHARDS = 4


@pytest.fixture(scope="module")
def pg_shards() -> int:
    return FAULT_SHARDS


@pytest.fixture
def make_stack(pg_dsns, amqp_url, redis_prefix, pg_admin, truncate, tmp_path):
    """`make_stack(**options)` -> a started FaultStack (stopped and cleaned up after the test)."""
    made: list[FaultStack] = []

    def make(env: dict[str, str] | None = None, **options) -> FaultStack:
        stack = FaultStack(
            fault_env(pg_dsns, amqp_url, REDIS_URL, redis_prefix, **(env or {})),
            tmp_path,
            pg_admin,
            **options,
        )
        made.append(stack)
        return stack.__enter__()

    yield make
    for stack in made:
        stack.__exit__(None, None, None)
    truncate()
