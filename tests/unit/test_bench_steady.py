"""bench.steady's pure parts: the job mix, the occurrences it expects, and the
figures it draws from the sink's arrivals."""

from bench.figures import Arrival
from bench.steady import iso, mix, occurrence_figures


def test_the_mix_and_the_occurrences_due_in_the_window():
    bodies, expected, kinds = mix(lambda i: f"http://sink/hook/{i}", start=1000.0, duration_s=120, rate=10)
    assert kinds.count("once") == 600  # half the rate over the window
    assert kinds.count("interval") == 45  # 45 % of the rate, every 10 s
    assert kinds.count("cron") == 30  # rate x 3, each firing once a minute
    # Interval grids start within the first 10 s: 12 occurrences each in 120 s.
    # Minute boundaries inside [1000, 1120): 1020 and 1080.
    assert expected == {"once": 600, "interval": 45 * 12, "cron": 30 * 2}
    assert bodies[0]["schedule"] == {"run_at": "1970-01-01T00:16:40.000Z"}
    assert bodies[0]["target"] == {"type": "webhook", "url": "http://sink/hook/0"}
    interval = bodies[600]["schedule"]
    assert interval["interval_s"] == 10 and interval["end_at"] == "1970-01-01T00:18:39.999Z"
    assert bodies[-1]["schedule"]["cron"] == "* * * * *"


def call(at, job, due, attempt="1"):
    return Arrival(
        at=at, path=f"/hook/{job}", attempt=attempt, key=f"j{job}:{iso(due)}", scheduled_for=iso(due)
    )


def test_occurrence_figures_first_call_lateness_missing_and_duplicates():
    kinds = ["once", "interval", "cron"]
    expected = {"once": 1, "interval": 2, "cron": 1}
    arrivals = [
        call(1000.25, 0, 1000.0),
        call(1010.5, 1, 1010.0),
        call(1012.0, 1, 1010.0, attempt="2"),  # the same occurrence again
        call(1200.0, 1, 1190.0),  # due after the window: not counted
        call(1061.0, 2, 1060.0),
    ]
    figures = occurrence_figures(arrivals, kinds, expected, start=1000.0, end=1120.0)
    assert figures["occurrences_due"] == 4
    assert figures["started"] == 3
    assert figures["missing"] == 1  # the interval job's second occurrence in the window never called
    assert figures["duplicate_calls"] == 1
    assert figures["lateness_s"]["max"] == 1.0
    assert figures["by_kind"]["interval"]["started"] == 1
    assert figures["by_kind"]["once"]["p50"] == 0.25
    # The latest first calls, latest first, each with its instant.
    assert [(late["kind"], late["late_s"]) for late in figures["latest"]] == [
        ("cron", 1.0),
        ("interval", 0.5),
        ("once", 0.25),
    ]
    assert figures["latest"][0]["due"] == iso(1060.0)
