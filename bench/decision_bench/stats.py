"""Order statistics for latency and throughput reports.

Percentiles interpolate linearly between closest ranks (numpy's default method), so reports compare with other tools."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 ≤ q ≤ 100) with linear interpolation; NaN for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    weight = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * weight


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99/mean/min/max in milliseconds; None where there is no sample (JSON has no NaN)."""
    if not seconds:
        return {key: None for key in ("p50", "p95", "p99", "mean", "min", "max")}
    ms = [value * 1000.0 for value in seconds]
    return {
        "p50": round(percentile(ms, 50.0), 3),
        "p95": round(percentile(ms, 95.0), 3),
        "p99": round(percentile(ms, 99.0), 3),
        "mean": round(sum(ms) / len(ms), 3),
        "min": round(min(ms), 3),
        "max": round(max(ms), 3),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0 or math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator
