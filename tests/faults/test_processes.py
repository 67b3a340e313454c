"""kill -9 of each kind of Punctual process (worker, beat, API), and a worker stopped
(SIGSTOP) and resumed, while a burst drains."""

from __future__ import annotations

import pytest

from tests.faults import injectors
from tests.faults.harness import DEAD_WORKER_WAIT_S, GOAL_S, SLACK_S, Load

pytestmark = pytest.mark.faults


def _assert_guarantee(outcome, stack, goal_s: float) -> None:
    verdict = outcome.verdict
    context = f"{outcome.row()}\n{verdict.summary()}\n{stack.logs()}"
    assert not verdict.lost, context
    assert not verdict.unexplained, context
    assert verdict.recovery_s <= goal_s + SLACK_S, context


@pytest.mark.slow
def test_no_fault_is_the_baseline(make_stack):
    stack = make_stack()
    outcome = stack.run(Load())
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.duplicates == 0 and outcome.verdict.lease_expired == 0, outcome.row()


def test_a_worker_killed_and_restarted(make_stack):
    """The killed worker's runs that were never called come back through the broker;
    those whose call may have gone out wait for their lease (PUNCTUAL_LEASE_S)."""
    stack = make_stack()
    outcome = stack.run(Load(), injectors.kill_worker(at_s=1.5, down_s=5.0))
    _assert_guarantee(outcome, stack, GOAL_S)
    _assert_in_flight_waited_less_than_the_bound(outcome)


# A burst a cap of 20 cannot keep up with (a call takes 0.2 s: 100 calls/s against
# 300 runs/s due): when the worker dies, most of the runs it started wait in the
# cap's line, never called.
_CAPPED = {"PUNCTUAL_TARGET_MAX_CONCURRENCY": "20"}
_CAP_BINDS = Load(one_offs=600, spread_s=2.0)
# Issue 40: a dead worker's runs that were never called are called within this of
# its death (another worker serves its queues) or of its restart (it was alone).
UNCALLED_GOAL_S = 10.0


def test_a_lone_worker_killed_mid_burst_calls_what_it_never_called_on_restart(make_stack):
    """The lone worker dies with runs started and waiting for a cap's slot: restarted,
    it finds them (its old process stopped beating) and calls them at once, its old
    slots given back; its calls in flight wait for their lease."""
    stack = make_stack(env=_CAPPED, workers=1)
    outcome = stack.run(_CAP_BINDS, injectors.kill_worker(at_s=1.0, down_s=5.0))
    _assert_guarantee(outcome, stack, UNCALLED_GOAL_S)
    _assert_in_flight_waited_less_than_the_bound(outcome)


def test_a_worker_killed_mid_burst_its_uncalled_runs_go_to_the_other(make_stack):
    """Of two workers, one dies for good with runs started and never called: the
    other calls them within seconds of the death, not after their leases."""
    stack = make_stack(env=_CAPPED)
    outcome = stack.run(_CAP_BINDS, injectors.kill_worker_for_good(at_s=1.0))
    _assert_guarantee(outcome, stack, UNCALLED_GOAL_S)
    assert outcome.verdict.from_fault_s <= UNCALLED_GOAL_S + SLACK_S, outcome.row()
    _assert_in_flight_waited_less_than_the_bound(outcome)


# A burst the sink answers at once: a worker killed in it (once a fifth is called) has
# runs whose names its claims had taken out and whose requests were not yet written.
_FAST_BURST = Load(one_offs=3000, spread_s=0.0, call_delay_s=0.0)
_MID_BURST = _FAST_BURST.one_offs // 5


def test_a_lone_worker_killed_in_a_fast_burst_calls_what_it_never_called_on_restart(make_stack):
    stack = make_stack(workers=1)
    outcome = stack.run(_FAST_BURST, injectors.kill_worker(at_s=0.0, down_s=5.0, after_calls=_MID_BURST))
    _assert_guarantee(outcome, stack, UNCALLED_GOAL_S)
    _assert_uncalled_taken_back_within_the_goal(outcome)
    _assert_in_flight_waited_less_than_the_bound(outcome)


def test_a_worker_killed_in_a_fast_burst_its_uncalled_runs_go_to_the_other(make_stack):
    stack = make_stack()
    outcome = stack.run(_FAST_BURST, injectors.kill_worker_for_good(at_s=0.0, after_calls=_MID_BURST))
    _assert_guarantee(outcome, stack, UNCALLED_GOAL_S)
    _assert_uncalled_taken_back_within_the_goal(outcome)
    assert outcome.verdict.from_fault_s <= UNCALLED_GOAL_S + SLACK_S, outcome.row()


def _assert_uncalled_taken_back_within_the_goal(outcome) -> None:
    """Runs the dead worker had claimed for their calls and never called (their names
    out of its roll) did not wait for their leases."""
    taken = outcome.verdict.uncalled_taken_s
    assert taken is None or taken <= UNCALLED_GOAL_S, outcome.row()


def test_the_beat_killed_and_restarted(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.kill_beat(at_s=1.0, down_s=6.0))
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.duplicates == 0, outcome.row()


def test_two_beats_fire_nothing_twice(make_stack):
    stack = make_stack()
    outcome = stack.run(Load(), injectors.second_beat())
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.duplicates == 0, outcome.row()


def test_the_api_killed_while_jobs_are_created(make_stack):
    """Every job the API accepted fires once; a client that sends again with its
    Idempotency-Key after the crash creates nothing twice."""
    stack = make_stack(with_api=True)
    load = Load(via_api=True, one_offs=150, lead_s=12.0, spread_s=3.0)
    outcome = stack.run(load, injectors.kill_api(at_s=-10.5, down_s=1.5))
    _assert_guarantee(outcome, stack, GOAL_S)
    assert stack.jobs_of_owner() == load.one_offs
    assert outcome.verdict.duplicates == 0, outcome.row()


@pytest.mark.slow
def test_a_stopped_worker_that_wakes_up_calls_nothing_it_lost(make_stack):
    """One worker stopped (SIGSTOP) longer than a lease, the other running: its runs
    are taken back and called again; once resumed it calls nothing whose lease it
    lost, so no target sees a lower attempt after a higher one."""
    stack = make_stack()
    outcome = stack.run(Load(call_delay_s=0.5), injectors.stop_worker(at_s=1.5, stopped_s=40.0))
    _assert_guarantee(outcome, stack, GOAL_S)
    assert outcome.verdict.inversions == 0, outcome.row()
    # (Messages it had taken but not started wait, unacknowledged, until it resumes or
    # their queued lease runs out: a stopped process keeps its broker connection.)


def _assert_in_flight_waited_less_than_the_bound(outcome) -> None:
    """The calls in flight when the worker died (or stopped) are settled, and the
    recurring jobs move on, within a lease and a janitor sweep."""
    assert outcome.settled_after_fault_s <= DEAD_WORKER_WAIT_S + SLACK_S, outcome.row()
    assert outcome.verdict.recurring_max_gap_s <= DEAD_WORKER_WAIT_S + SLACK_S, outcome.row()


@pytest.mark.slow
def test_a_worker_cut_off_from_the_network_for_30s(make_stack):
    """A worker in its own network namespace loses Postgres, RabbitMQ, Redis and the
    target for 30 s, the other worker keeps running. Its calls in flight come back
    through their leases, and what it had not called is called by the other worker."""
    from tests.faults.netns import Partition

    why = Partition.available()
    if why:
        pytest.skip(f"no network namespace on this machine: {why}")
    stack = make_stack(partitioned=True)
    outcome = stack.run(Load(call_delay_s=0.5), injectors.partition_worker(at_s=1.5, cut_s=30.0))
    _assert_guarantee(outcome, stack, GOAL_S)
