"""Turns rounds of outcomes into the JSON report: throughput, latency, errors, tokens, and B/A ratios.

A server that sends Server-Timing also gets `server_timing_ms`; one that sends none gets no such section."""

from __future__ import annotations

from collections import Counter
from typing import Any

from decision_bench import server_timing
from decision_bench.runner import RoundResult
from decision_bench.stats import latency_summary, median, percentile, ratio


def round_summary(result: RoundResult, questions: int) -> dict[str, Any]:
    ok = result.ok
    latencies = [outcome.seconds for outcome in ok]
    return {
        "seconds": round(result.wall_seconds, 3),
        "requests": len(result.outcomes),
        "requests_ok": len(ok),
        "questions_per_s": round(len(ok) * questions / result.wall_seconds, 4),
        "requests_per_s": round(len(ok) / result.wall_seconds, 4),
        "latency_p50_ms": round(percentile(latencies, 50.0) * 1000.0, 3) if latencies else None,
    }


def bad_summary(outcomes: list[Any]) -> dict[str, Any]:
    """Deliberately bad requests: how many, their statuses, and how many got anything but a 4xx."""
    statuses = Counter(outcome.status for outcome in outcomes)
    return {
        "sent": len(outcomes),
        "by_kind": dict(sorted(Counter(outcome.bad for outcome in outcomes).items())),
        "by_status": dict(sorted(statuses.items())),
        "not_4xx": sum(count for status, count in statuses.items() if not (status.isdigit() and status[0] == "4")),
    }


def open_loop_summary(outcomes: list[Any], offered_rate: float, seconds: float) -> dict[str, Any]:
    """What happened to the arrivals of an open loop: dropped ones were never sent (too many in flight)."""
    dropped = sum(outcome.status == "dropped" for outcome in outcomes)
    return {
        "offered_requests_per_s": offered_rate,
        "arrived": len(outcomes),
        "sent": len(outcomes) - dropped,
        "dropped": dropped,
        "timed_out": sum(outcome.status == "timeout" for outcome in outcomes),
        "answered_ok": sum(outcome.status == "200" for outcome in outcomes),
        "dropped_or_failed_fraction": round(1 - sum(o.status == "200" for o in outcomes) / len(outcomes), 4)
        if outcomes
        else None,
    }


def server_summary(url: str, rounds: list[RoundResult], questions: int, token_source: str) -> dict[str, Any]:
    every = [outcome for result in rounds for outcome in result.outcomes]
    bad = [outcome for outcome in every if outcome.bad is not None]
    outcomes = [outcome for outcome in every if outcome.bad is None]
    ok = [outcome for outcome in outcomes if outcome.status == "200"]
    seconds = sum(result.wall_seconds for result in rounds)
    per_round = [round_summary(result, questions) for result in rounds]
    statuses = Counter(outcome.status for outcome in outcomes)
    input_tokens = [outcome.input_tokens for outcome in ok if outcome.input_tokens is not None]
    cached_tokens = [outcome.cached_tokens for outcome in ok if outcome.cached_tokens is not None]
    naive_tokens = sum(outcome.naive_prompt_tokens for outcome in ok)
    state_tokens = [outcome.state_tokens for outcome in ok]
    tokens: dict[str, Any] = {
        "requests_counted": len(ok),
        "server_reported_requests": len(input_tokens),
        "server_input_tokens": sum(input_tokens) if input_tokens else None,
        "server_input_tokens_per_request": round(sum(input_tokens) / len(input_tokens), 2) if input_tokens else None,
        "server_cached_tokens": sum(cached_tokens) if cached_tokens else None,
        "estimated_per_question_prompt_tokens": naive_tokens if ok else None,
        "estimated_per_question_prompt_tokens_per_request": round(naive_tokens / len(ok), 2) if ok else None,
        "state_tokens_per_request": round(sum(state_tokens) / len(state_tokens), 2) if state_tokens else None,
        "estimate_source": token_source,
    }
    tokens["estimated_over_server_ratio"] = _rounded(
        ratio(tokens["estimated_per_question_prompt_tokens"], tokens["server_input_tokens"])
    )
    summary: dict[str, Any] = {
        "url": url,
        "seconds": round(seconds, 3),
        "requests_total": len(outcomes),
        "requests_ok": len(ok),
        "errors_by_status": {status: count for status, count in sorted(statuses.items()) if status != "200"},
        "questions_per_s": round(len(ok) * questions / seconds, 4) if seconds else None,
        "requests_per_s": round(len(ok) / seconds, 4) if seconds else None,
        "latency_ms": latency_summary([outcome.seconds for outcome in ok]),
        "median_of_rounds": {
            key: _rounded(median([value for value in (r[key] for r in per_round) if value is not None]))
            for key in ("questions_per_s", "requests_per_s", "latency_p50_ms")
        },
        "rounds": per_round,
        "tokens": tokens,
    }
    if bad:
        summary["bad_requests"] = bad_summary(bad)
    offered = [result.offered_rate for result in rounds if result.offered_rate is not None]
    if offered:
        summary["open_loop"] = open_loop_summary(outcomes, offered[0], seconds)
    timings = server_timing.summarize([outcome.server_timing for outcome in ok])
    if timings:
        summary["server_timing_ms"] = timings
    return summary


def ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """B/A: above 1 means B answers more questions per second (or, for latencies, takes longer)."""
    return {
        "median_round_questions_per_s": _rounded(
            ratio(b["median_of_rounds"]["questions_per_s"], a["median_of_rounds"]["questions_per_s"])
        ),
        "median_round_requests_per_s": _rounded(
            ratio(b["median_of_rounds"]["requests_per_s"], a["median_of_rounds"]["requests_per_s"])
        ),
        "median_round_latency_p50": _rounded(
            ratio(b["median_of_rounds"]["latency_p50_ms"], a["median_of_rounds"]["latency_p50_ms"])
        ),
        "questions_per_s": _rounded(ratio(b["questions_per_s"], a["questions_per_s"])),
        "latency_p50": _rounded(ratio(b["latency_ms"]["p50"], a["latency_ms"]["p50"])),
        "latency_p95": _rounded(ratio(b["latency_ms"]["p95"], a["latency_ms"]["p95"])),
        "latency_p99": _rounded(ratio(b["latency_ms"]["p99"], a["latency_ms"]["p99"])),
    }


def _rounded(value: float | None) -> float | None:
    if value is None or value != value:  # NaN
        return None
    return round(value, 4)
