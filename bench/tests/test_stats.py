"""Percentiles and summaries: linear interpolation between closest ranks, like numpy's default."""

from __future__ import annotations

import math
import random

import pytest

from decision_bench.stats import latency_summary, median, percentile, ratio


def test_percentile_known_values() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 25) == pytest.approx(1.75)
    assert percentile(values, 95) == pytest.approx(3.85)


def test_percentile_ignores_input_order_and_does_not_mutate() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert values == [5.0, 1.0, 4.0, 2.0, 3.0]


def test_single_and_empty() -> None:
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    assert median([3.0, 1.0]) == 2.0


def test_percentile_range_checked() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_matches_numpy() -> None:
    numpy = pytest.importorskip("numpy")
    rng = random.Random(3)
    for size in (1, 2, 3, 10, 101, 1000):
        values = [rng.expovariate(1.0) for _ in range(size)]
        for q in (0, 1, 50, 90, 95, 99, 99.9, 100):
            assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)), rel=1e-12)


def test_latency_summary_in_milliseconds() -> None:
    summary = latency_summary([0.1, 0.2, 0.3, 0.4])
    assert summary["p50"] == 250.0
    assert summary["min"] == 100.0
    assert summary["max"] == 400.0
    assert summary["mean"] == 250.0
    assert summary["p99"] == pytest.approx(397.0)
    assert latency_summary([]) == {key: None for key in ("p50", "p95", "p99", "mean", "min", "max")}


def test_ratio_handles_missing_and_zero() -> None:
    assert ratio(6.0, 2.0) == 3.0
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(math.nan, 1.0) is None
