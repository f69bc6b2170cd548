"""The GPU check's summary: rows and MFU from synthetic decision-bench reports, and the non-embedding parameter count
against a real checkpoint's tensors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from decision_bench.gpu_summary import main, non_embedding_parameters, summarize

TINY_QWEN3 = Path.home() / ".cache/decision-inference/models/tiny-qwen3"
QWEN3_06B = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def report(
    questions: int,
    concurrency: int,
    seconds: float,
    ok: int,
    computed: int | None,
    rate: float | None = None,
    idle: float | None = None,
):
    metrics = {"deltas": {"decision_computed_tokens_total": computed} if computed is not None else {}}
    if idle is not None:
        metrics["shard_idle_fraction"] = idle
    server = {
        "seconds": seconds,
        "questions_per_s": ok * questions / seconds,
        "latency_ms": {"p50": 10.0, "p99": 40.0},
        "tokens": {"server_input_tokens": 999, "server_cached_tokens": 0},
        "server_metrics": metrics,
    }
    workload = {
        "questions": questions,
        "concurrency": concurrency,
        "rate": rate,
        "max_outstanding": 256 if rate else None,
    }
    return {"tool": "decision-bench 0.1", "workload": workload, "servers": {"A": server}}


def test_parameter_count_matches_the_checkpoint() -> None:
    safetensors = pytest.importorskip("safetensors")
    if not (TINY_QWEN3 / "model.safetensors").exists():
        pytest.skip("no tiny-qwen3 fixture (make fixtures)")
    with safetensors.safe_open(str(TINY_QWEN3 / "model.safetensors"), "np") as weights:
        total = sum(
            math.prod(weights.get_slice(name).get_shape())
            for name in weights.keys()
            if "embed_tokens" not in name and not name.startswith("lm_head")
        )
    assert non_embedding_parameters(json.loads((TINY_QWEN3 / "config.json").read_text())) == total


def test_parameter_count_of_the_qwen3_06b_shape() -> None:
    # Qwen3-0.6B: 0.44 B parameters without the embedding (its model card: 0.6 B in all, 0.44 B non-embedding).
    assert non_embedding_parameters(QWEN3_06B) == pytest.approx(0.44e9, rel=0.01)


def test_rows_mfu_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    (tmp_path / "8x512-c64.json").write_text(json.dumps(report(8, 64, 10.0, 100, computed=1_000_000, idle=0.0125)))
    (tmp_path / "8x512-c1.json").write_text(json.dumps(report(8, 1, 10.0, 5, computed=None)))
    (tmp_path / "1x300-open.json").write_text(json.dumps(report(1, 1, 10.0, 9000, computed=2_700_000, rate=1000.0)))
    (tmp_path / "gpu-check.log").write_text("not a report")
    (tmp_path / "other.json").write_text(json.dumps({"not": "a decision-bench report"}))
    assert main([str(tmp_path), "--config", str(tmp_path), "--device", "NVIDIA H200", "--commit", "abc1234"]) == 0
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["workload"], r["concurrency"]) for r in rows] == [("8x512", 1), ("8x512", 64), ("1x300-open", 256)]
    c1, c64, open_loop = rows
    assert c64["questions_per_s"] == 80.0 and c64["p50_ms"] == 10.0 and c64["p99_ms"] == 40.0
    assert c64["prompt_tokens_per_s"] == 100_000.0
    parameters = non_embedding_parameters(QWEN3_06B)
    assert c64["mfu"] == pytest.approx(100_000 * 2 * parameters / 989e12, rel=1e-3)
    assert c1["prompt_tokens_per_s"] == 99.9  # no router counter: the answers' usage
    assert open_loop["prompt_tokens_per_s"] == 270_000.0
    assert {r["device"] for r in rows} == {"NVIDIA H200"} and {r["commit"] for r in rows} == {"abc1234"}
    # The device's idle share where the server reported it (a router before decision_shard_idle_seconds: none).
    assert (c64["device_idle_fraction"], c1["device_idle_fraction"]) == (0.0125, None)
    table = capsys.readouterr().out
    assert table.startswith("| workload | C |") and "| 8x512 | 64 | 80.0 | 10.0 | 40.0 | 100000.0 |" in table
    assert " | 1.2 % | NVIDIA H200 | abc1234 |" in table


def test_unknown_card_has_no_mfu_and_a_model_per_workload(tmp_path: Path) -> None:
    (tmp_path / "32x2048-c64.json").write_text(json.dumps(report(32, 64, 10.0, 10, computed=500_000)))
    (tmp_path / "8x2048-8b-c64.json").write_text(json.dumps(report(8, 64, 10.0, 10, computed=500_000)))
    config = tmp_path / "q.json"
    config.write_text(json.dumps(QWEN3_06B))
    rows = summarize(tmp_path, {"8x2048-8b": config}, None, "cpu", "abc")
    assert [r["workload"] for r in rows] == ["32x2048", "8x2048-8b"]
    assert rows[0]["mfu"] is None  # no model for it
    assert rows[1]["mfu"] is None  # a CPU has no peak in the table
    assert rows[1]["prompt_tokens_per_s"] == 50_000.0


def test_parameter_count_of_the_carried_qwen3_8b_config() -> None:
    # Qwen3-8B's model card: 6.95 B parameters without the embedding; the GPU check's 8B cell uses this config.
    config = json.loads((Path(__file__).parents[1] / "configs/qwen3-8b/config.json").read_text())
    assert non_embedding_parameters(config) == pytest.approx(6.95e9, rel=0.005)
