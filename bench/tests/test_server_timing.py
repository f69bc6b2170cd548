"""Server-Timing: lenient parsing of the router's header and per-name summaries in milliseconds."""

from __future__ import annotations

import pytest

from decision_bench.server_timing import ROUTER_PLUS_QUEUE, parse, summarize


def test_parses_the_routers_header() -> None:
    assert parse("router;dur=1.250, queue;dur=0.250, shard;dur=40.000") == {
        "router": 1.25,
        "queue": 0.25,
        "shard": 40.0,
    }


def test_absent_or_empty_header_gives_nothing() -> None:
    assert parse(None) == {}
    assert parse("") == {}
    assert parse(" , ,") == {}


def test_malformed_entries_are_skipped_not_raised() -> None:
    header = (
        "cache, ;dur=3, bad name;dur=1, nodur;desc=x, text;dur=abc, inf;dur=inf, nan;dur=nan, "
        "negative;dur=-1, empty;dur=, ok;dur=2"
    )
    assert parse(header) == {"ok": 2.0}


def test_extra_params_quotes_and_case() -> None:
    header = 'db;desc="a, b; c";dur=3.5, app;DUR="7", total ; dur = 12 ; desc=x'
    assert parse(header) == {"db": 3.5, "app": 7.0, "total": 12.0}


def test_escaped_quote_inside_desc_keeps_the_split() -> None:
    assert parse(r'db;desc="say \"hi, there\"";dur=1, app;dur=2') == {"db": 1.0, "app": 2.0}


def test_first_of_a_repeated_name_or_param_counts() -> None:
    assert parse("router;dur=1;dur=9, router;dur=5") == {"router": 1.0}


def test_summary_per_name_and_router_plus_queue() -> None:
    timings = [
        {"router": 1.0, "queue": 0.5, "shard": 40.0},
        {"router": 2.0, "queue": 1.5, "shard": 50.0},
        {"router": 3.0, "shard": 60.0},
        {"router": 4.0, "queue": 0.0},
        {},
    ]
    summary = summarize(timings)
    assert summary["router"] == {"requests": 4, "p50": 2.5, "p95": 3.85, "p99": 3.97, "mean": 2.5}
    assert summary["queue"]["requests"] == 3
    assert summary["queue"]["p50"] == 0.5
    assert summary["shard"]["requests"] == 3
    assert summary["shard"]["mean"] == 50.0
    # Only requests carrying both router and queue: 1.5, 3.5, 4.0.
    assert summary[ROUTER_PLUS_QUEUE]["requests"] == 3
    assert summary[ROUTER_PLUS_QUEUE]["p50"] == 3.5
    assert summary[ROUTER_PLUS_QUEUE]["mean"] == pytest.approx(3.0)


def test_summary_without_timings_is_empty() -> None:
    assert summarize([]) == {}
    assert summarize([{}, {}]) == {}
    assert ROUTER_PLUS_QUEUE not in summarize([{"shard": 40.0}])
