"""bench.compare's pure part: each component's CPU per run, the median over the rounds."""

from bench.compare import component_lines, component_medians


def run(**cpu: float | None) -> dict:
    return {"cpu_ms_per_run": cpu}


def test_a_component_is_the_median_of_the_runs_that_measured_it_and_totals_are_left_out():
    runs = [
        run(workers=1.2, redis=0.05, total=1.6),
        run(workers=1.0, redis=None, total=1.4),
        run(workers=1.1, redis=0.07, total=1.5),
    ]
    assert component_medians(runs) == {"workers": 1.1, "redis": 0.06}


def test_each_system_prints_on_a_line_of_its_own():
    lines = component_lines({"punctual": [run(workers=1.0, total=1.0)], "pgqueuer": [run(consumers=0.5)]})
    assert lines == ["punctual: workers 1.0", "pgqueuer: consumers 0.5"]
