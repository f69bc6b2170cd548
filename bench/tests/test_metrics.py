"""Prometheus text parsing and before/after deltas."""

from __future__ import annotations

from decision_bench import metrics

BEFORE = """# TYPE decision_batch_reads summary
decision_batch_reads{quantile="0.5"} 3
decision_batch_reads_sum 3
decision_batch_reads_count 1
decision_shard_forward_seconds_sum 0.5
decision_shard_forward_seconds_count 1
decision_http_requests_total{path="/v1/systemone",status="200"} 1
decision_queued_reads 0
"""

AFTER = """decision_batch_reads{quantile="0.5"} 8
decision_batch_reads_sum 19
decision_batch_reads_count 3
decision_batch_requests_sum 3
decision_batch_requests_count 3
decision_shard_forward_seconds_sum 2.5
decision_shard_forward_seconds_count 3
decision_shard_idle_seconds_sum 0.2
decision_shard_idle_seconds_count 2
decision_http_requests_total{path="/v1/systemone",status="200"} 3
decision_http_requests_total{path="/v1/systemone",status="429"} 1
decision_queued_reads 5
"""


def test_parse_reads_labels_and_values() -> None:
    samples = metrics.parse(AFTER)
    assert samples[("decision_batch_reads_sum", "")] == 19.0
    assert samples[("decision_http_requests_total", '{path="/v1/systemone",status="429"}')] == 1.0


def test_delta_keeps_only_grown_monotone_series() -> None:
    grown = metrics.delta(metrics.parse(BEFORE), metrics.parse(AFTER))
    assert grown[("decision_batch_reads_sum", "")] == 16.0
    assert grown[("decision_batch_reads_count", "")] == 2.0
    assert grown[("decision_http_requests_total", '{path="/v1/systemone",status="429"}')] == 1.0
    assert ("decision_queued_reads", "") not in grown  # a gauge
    assert ("decision_batch_reads", '{quantile="0.5"}') not in grown  # a quantile


def test_summarize_batch_means() -> None:
    grown = metrics.delta(metrics.parse(BEFORE), metrics.parse(AFTER))
    report = metrics.summarize(grown, wall_seconds=4.0)
    assert report["batches"] == 2
    assert report["mean_reads_per_batch"] == 8.0
    assert report["mean_forward_seconds"] == 1.0
    assert report["forward_busy_fraction"] == 0.5
    # The shard's model thread: 0.2 s idle before the 2 batches of 4 s.
    assert report["mean_idle_seconds"] == 0.1
    assert report["shard_idle_fraction"] == 0.05


def test_summarize_other_servers() -> None:
    labels = '{engine="0",model_name="m"}'
    grown = {("vllm:prompt_tokens_total", labels): 10.0, ("vllm:prompt_tokens_cached_total", labels): 8.0}
    report = metrics.summarize(grown, wall_seconds=1.0)
    assert "batches" not in report
    assert report["vllm_prompt_tokens"] == 10
    assert report["vllm_prompt_tokens_cached"] == 8
    deltas = report["deltas"]
    assert isinstance(deltas, dict)
    assert deltas["vllm:prompt_tokens_total" + labels] == 10.0
