"""The W3C `Server-Timing` header a decision router sends per answer (`router;dur=1.25, queue;dur=0.25, shard;dur=40`).

Parsed leniently (other servers send none, odd entries are skipped) and summarized per timing name in milliseconds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from decision_bench.stats import percentile

# At concurrency 1 the router's overhead (HTTP parse → gRPC send, gRPC reply → HTTP response) is router + queue.
ROUTER_PLUS_QUEUE = "router_plus_queue"

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def parse(header: str | None) -> dict[str, float]:
    """Timing name → `dur` in milliseconds; entries without a finite, non-negative `dur` are skipped.

    As in the W3C spec, the first of a repeated name or parameter counts; `desc="a, b"` may hold commas."""
    timings: dict[str, float] = {}
    for entry in _split_unquoted(header or "", ","):
        name, *params = _split_unquoted(entry, ";")
        name = name.strip()
        if not _TOKEN.match(name) or name in timings:
            continue
        duration = _duration(params)
        if duration is not None:
            timings[name] = duration
    return timings


def summarize(timings: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float | int]]:
    """Per name (and router_plus_queue): requests carrying it and p50/p95/p99/mean ms; {} when none carried any."""
    values: dict[str, list[float]] = {}
    for timing in timings:
        for name, milliseconds in timing.items():
            values.setdefault(name, []).append(milliseconds)
        if "router" in timing and "queue" in timing:
            values.setdefault(ROUTER_PLUS_QUEUE, []).append(timing["router"] + timing["queue"])
    return {
        name: {
            "requests": len(sample),
            "p50": round(percentile(sample, 50.0), 3),
            "p95": round(percentile(sample, 95.0), 3),
            "p99": round(percentile(sample, 99.0), 3),
            "mean": round(sum(sample) / len(sample), 3),
        }
        for name, sample in values.items()
    }


def _duration(params: list[str]) -> float | None:
    """The first `dur` parameter as a finite, non-negative float, or None."""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() != "dur":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        try:
            duration = float(value)
        except ValueError:
            return None
        return duration if math.isfinite(duration) and duration >= 0.0 else None
    return None


def _split_unquoted(text: str, separator: str) -> list[str]:
    """`text` split at `separator`s outside double-quoted strings (backslash escapes honoured inside quotes)."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts
