"""bench.peers' pure part: the steady peer's figures from the sink's arrivals."""

from bench.figures import Arrival
from bench.peers import steady_figures


def call(at: float, job: int) -> Arrival:
    return Arrival(at=at, path=f"/hook/{job}", attempt="", key="", scheduled_for="")


def test_steady_figures_count_first_calls_missing_and_calls_again():
    dues = [100.0, 100.005, 100.010, 100.015]
    arrivals = [
        call(100.002, 0),  # 2 ms late
        call(100.004, 1),  # before its instant: on time, not early credit
        call(100.050, 2),  # 40 ms late
        call(100.020, 0),  # called again, later: the first call counts
    ]
    figures = steady_figures(arrivals, dues)
    assert figures["started"] == 3
    assert figures["missing"] == 1
    assert figures["duplicate_calls"] == 1
    assert figures["lateness_s"] == {"p50": 0.002, "p90": 0.04, "p99": 0.04, "max": 0.04}


def test_steady_figures_take_the_earliest_call_whatever_the_log_order():
    figures = steady_figures([call(100.3, 0), call(100.1, 0)], [100.0])
    assert figures["started"] == 1 and figures["duplicate_calls"] == 1
    assert figures["lateness_s"]["max"] == 0.1


def test_calls_of_paths_outside_the_jobs_are_not_counted():
    figures = steady_figures([call(100.0, 7)], [100.0])
    assert figures == {
        "started": 0,
        "missing": 1,
        "duplicate_calls": 0,
        "lateness_s": {"p50": None, "p90": None, "p99": None, "max": None},
    }
