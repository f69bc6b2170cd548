"""Server-side batch statistics from Prometheus `/metrics`, scraped before and after a run.

Only monotone series (counters, summary/histogram _sum and _count) are diffed; no /metrics, no report."""

from __future__ import annotations

import re
from collections.abc import Mapping

Sample = tuple[str, str]  # (metric name, label text as written, "" when none)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_MONOTONE_SUFFIXES = ("_total", "_sum", "_count")

# Summaries the decision router exports; reported as means per batch / per request.
_BATCH_SUMMARIES = {
    "decision_batch_reads": "reads_per_batch",
    "decision_batch_requests": "requests_per_batch",
    "decision_batch_duration_seconds": "batch_seconds",
    "decision_shard_forward_seconds": "forward_seconds",
    # How long the shard's model thread sat idle before each batch (under load: the device waiting for the router).
    "decision_shard_idle_seconds": "idle_seconds",
    # Joint-schema (Clef) shards: the head's part of forward_seconds (the rest is the backbone).
    "decision_shard_head_seconds": "head_seconds",
}


def parse(text: str) -> dict[Sample, float]:
    samples: dict[Sample, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples[(match.group(1), match.group(2) or "")] = value
    return samples


def delta(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> dict[Sample, float]:
    """Growth of each monotone series between two scrapes (series absent before count from zero)."""
    grown: dict[Sample, float] = {}
    for key, value in after.items():
        if not key[0].endswith(_MONOTONE_SUFFIXES):
            continue
        change = value - before.get(key, 0.0)
        if change != 0:
            grown[key] = change
    return grown


def add(total: dict[Sample, float], more: Mapping[Sample, float]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value


def summarize(grown: Mapping[Sample, float], wall_seconds: float) -> dict[str, object]:
    """Batch means for a decision router, plus every grown series (so other servers' counters show too)."""
    report: dict[str, object] = {}
    batches = grown.get(("decision_batch_reads_count", ""), 0.0)
    if batches:
        report["batches"] = int(batches)
        for name, label in _BATCH_SUMMARIES.items():
            count = grown.get((f"{name}_count", ""), 0.0)
            if count:
                report[f"mean_{label}"] = round(grown.get((f"{name}_sum", ""), 0.0) / count, 6)
        forward = grown.get(("decision_shard_forward_seconds_sum", ""), 0.0)
        if forward and wall_seconds > 0:
            # Share of the measured wall time the shard spent in forward passes: the rest is queueing, HTTP, tokenizing.
            report["forward_busy_fraction"] = round(forward / wall_seconds, 4)
        idle = grown.get(("decision_shard_idle_seconds_sum", ""), 0.0)
        if idle and wall_seconds > 0:
            # Share of the wall time the shard's model thread sat idle between batches (capped: the first batch of a
            # round counts the pause before it).
            report["shard_idle_fraction"] = round(min(idle / wall_seconds, 1.0), 4)
        head = grown.get(("decision_shard_head_seconds_sum", ""), 0.0)
        if forward and head:
            # Pooled (Clef) reads: the joint-schema head's share of the shard's forward time; the rest is the backbone.
            report["head_share_of_forward"] = round(head / forward, 4)
    # vLLM's own counters (labels vary by model name): prompt tokens it computed vs took from its prefix cache.
    for key, label in (
        ("vllm:prompt_tokens_total", "prompt_tokens"),
        ("vllm:prompt_tokens_cached_total", "prompt_tokens_cached"),
    ):
        values = [value for (name, _), value in grown.items() if name == key]
        if values:
            report[f"vllm_{label}"] = int(sum(values))
    report["deltas"] = {f"{name}{labels}": round(value, 6) for (name, labels), value in sorted(grown.items())}
    return report
