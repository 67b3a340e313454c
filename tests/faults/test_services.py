"""The services fail under a burst: Postgres connections cut and Postgres restarted,
RabbitMQ stopped and started, Redis connections killed and Redis paused, and row
locks held across the burst. Nothing is lost, every duplicate is explained by an
expired lease, and what was never called is called soon after the fault ends.

The restarts and the pause touch the machine's shared services: each is brief, and
healed (and waited for) whatever happens.
"""

from __future__ import annotations

import pytest

from tests.faults import injectors
from tests.faults.harness import GOAL_DB_S, GOAL_S, SLACK_S, Load

pytestmark = pytest.mark.faults


def _assert_guarantee(outcome, stack, goal_s: float) -> None:
    verdict = outcome.verdict
    context = f"{outcome.row()}\n{verdict.summary()}\n{stack.logs()}"
    assert not verdict.lost, context
    assert not verdict.unexplained, context
    assert verdict.recovery_s <= goal_s + SLACK_S, context


def test_postgres_connections_cut_twice(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.cut_postgres_connections(at_s=1.5, again_after_s=2.5))
    _assert_guarantee(outcome, stack, GOAL_DB_S)
    # A cut costs a retry of the write, not a lease: no run is taken back.
    assert outcome.verdict.lease_expired == 0, outcome.row()


def test_the_databases_unreachable_for_longer_than_a_write_is_retried(make_stack):
    """15 s without the registry: the dispatch tasks give their messages back (rather
    than being acknowledged with their runs unstarted) and the runs start as soon as
    the databases answer, without waiting for a lease."""
    stack = make_stack()
    outcome = stack.run(Load(), injectors.refuse_connections(at_s=1.5, down_s=15.0))
    _assert_guarantee(outcome, stack, GOAL_DB_S)


def test_row_locks_held_across_the_burst(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.hold_row_locks(at_s=-1.0, hold_s=6.0))
    _assert_guarantee(outcome, stack, GOAL_DB_S)


def test_redis_connections_killed(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.kill_redis_connections(at_s=1.5))
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.duplicates == 0, outcome.row()


@pytest.mark.slow  # it pauses every client of the machine's Redis
def test_redis_paused(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.pause_redis(at_s=1.5, pause_s=3.0))
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.duplicates == 0, outcome.row()


@pytest.mark.slow
def test_postgres_restarted(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.restart_postgres(at_s=1.5))
    _assert_guarantee(outcome, stack, GOAL_DB_S)


@pytest.mark.slow
def test_rabbitmq_stopped_and_started(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.stop_rabbitmq(at_s=2.0, down_s=8.0))
    _assert_guarantee(outcome, stack, GOAL_S)
