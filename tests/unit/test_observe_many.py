"""Observing a batch of amounts in a histogram at once is observing each (no I/O)."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram

from app.metrics import START_LATENESS, observe_many

BOUNDS = START_LATENESS._upper_bounds


def samples(histogram: Histogram) -> dict:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in histogram.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


def test_a_batch_lands_in_the_buckets_and_the_sum_that_one_by_one_would():
    one_by_one = Histogram("one_by_one", "", buckets=BOUNDS[:-1], registry=CollectorRegistry())
    at_once = Histogram("one_by_one", "", buckets=BOUNDS[:-1], registry=CollectorRegistry())
    randoms = random.Random(7)
    # Every bound exactly (an amount at a bound counts in that bucket), just above each,
    # zero, a negative amount, far past the last bound, and a spread of others.
    amounts = [*BOUNDS[:-1], *(b + 1e-9 for b in BOUNDS[:-1]), 0.0, -1.0, 1e9]
    amounts += [randoms.expovariate(0.2) for _ in range(500)]
    for amount in amounts:
        one_by_one.observe(amount)
    observe_many(at_once, amounts[:100])
    observe_many(at_once, amounts[100:])
    observe_many(at_once, [])
    expected, got = samples(one_by_one), samples(at_once)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-6 * max(1.0, abs(value)), key


def test_a_labelled_histogram_is_observed_through_its_child():
    parent = Histogram("labelled", "", ["shard"], registry=CollectorRegistry())
    observe_many(parent.labels("3"), [0.1, 7.0])
    counts = {s.labels.get("le"): s.value for s in parent.collect()[0].samples if s.name == "labelled_bucket"}
    assert counts["+Inf"] == 2 and counts["0.1"] == 1
