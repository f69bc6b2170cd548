"""The compiled layers replayed per token-count bucket (`step_graphs`, `--cuda-graphs auto`): a pass padded into the
graphs' static buffers must read exactly what the compiled pass reads, on every kind of pass, whatever earlier passes
left in the buffers. CPU has no CUDA graphs, so these tests replay each piece by calling it (`replay_eagerly`): the
buffers, padding, key/value copies and bucket choice are the ones a GPU replays; only the recording is not."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import use_segment_kernel
from test_packed_batches import assert_equals_transformers, many_requests

from decision_server import step_graphs
from decision_server.decoder_model import DecoderModel
from decision_server.engines import ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache

SMALL_BUCKETS = (16, 64, 256, 1024)


@pytest.fixture(scope="module")
def graphed_qwen3(tiny_qwen3_dir: Path) -> DecoderModel:
    model = load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", compile_mode="auto", cuda_graphs="auto"))
    assert isinstance(model, DecoderModel) and model.network.graph is not None
    assert model.cuda_graph_buckets == ()  # CPU: nothing captured by default
    graphs = step_graphs.StepGraphs(model.network.graph, SMALL_BUCKETS, step_graphs.replay_eagerly)
    graphs.capture_all()
    model.network.step_graphs = graphs
    return model


def count_replays(graphs: step_graphs.StepGraphs, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Records every replay (piece, layer, bucket)."""
    played: list[tuple[str, int, int]] = []
    for key, replay in list(graphs._replays.items()):

        def counted(key: tuple[str, int, int] = key, replay: Any = replay) -> None:
            played.append(key)
            replay()

        monkeypatch.setitem(graphs._replays, key, counted)
    return played


def test_buckets_are_the_smallest_that_hold_a_pass() -> None:
    buckets = (16, 64, 256)
    assert step_graphs.bucket_for(1, buckets) == 16
    assert step_graphs.bucket_for(16, buckets) == 16
    assert step_graphs.bucket_for(17, buckets) == 64
    assert step_graphs.bucket_for(256, buckets) == 256
    assert step_graphs.bucket_for(257, buckets) is None
    # The served buckets pad a pass by less than half of it from 256 tokens on.
    for tokens in range(257, step_graphs.BUCKETS[-1] + 1, 7):
        bucket = step_graphs.bucket_for(tokens, step_graphs.BUCKETS)
        assert bucket is not None and bucket < 1.5 * tokens + 1


@pytest.mark.parametrize("kernel", ["split", "sdpa", "flex"], ids=["cpu-kernels", "sdpa-per-segment", "flex-one-call"])
def test_a_packed_batch_through_the_graphs_equals_transformers(
    graphed_qwen3: DecoderModel, tiny_qwen3_reference: Any, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Many requests in one pass, then the same states from the prefix cache beside new ones: every read equals
    transformers within the exactness tolerance, and the passes ran in the graphs' buckets."""
    use_segment_kernel(monkeypatch, graphed_qwen3, kernel)
    graphs = graphed_qwen3.network.step_graphs
    assert graphs is not None
    played = count_replays(graphs, monkeypatch)
    engine = TreeEngine(graphed_qwen3, prefix_cache=PrefixCache(64 << 20), min_split_tokens=64)
    cold = many_requests(requests=4, state_tokens=60, questions=3)
    first = engine.run(cold)
    assert first.forward_passes == 1
    assert_equals_transformers(tiny_qwen3_reference, cold, first, 1e-5)
    layers = len(graphed_qwen3.network.layers)
    # One pass of about 300 tokens: layer 0's entry and a step per layer but the last, all in bucket 1024 (the
    # last layer's kept rows leave eagerly).
    assert [piece for piece, _, _ in played] == ["enter"] + ["step"] * (layers - 1)
    assert {bucket for _, _, bucket in played} == {1024}
    warm = many_requests(requests=4, state_tokens=60, questions=3) + many_requests(2, 30, 2, seed=9)
    second = engine.run(warm)
    assert_equals_transformers(tiny_qwen3_reference, warm, second, 1e-5)


def test_passes_of_every_length_equal_the_compiled_pass_whatever_the_buffers_held(graphed_qwen3: DecoderModel) -> None:
    """Long passes leave rows in the buffers; shorter ones after them pad with zeros and read only their own rows.
    Hidden states, keys and values (which outlive the pass: copies, not views of the buffers) equal the compiled
    pass's; a pass longer than every bucket runs the compiled pieces."""
    network = graphed_qwen3.network
    graphs = network.step_graphs
    assert graphs is not None
    generator = torch.Generator().manual_seed(3)
    kept: list[Any] = []
    for tokens in (900, 17, 250, 64, 3, 1100):
        ids = torch.randint(5, 400, (tokens,), generator=generator)
        positions = torch.arange(tokens)
        keep = [0, tokens // 2, tokens - 1]
        for rows in (None, keep):
            with torch.inference_mode():
                network.step_graphs = graphs
                ours, our_kv = network.hidden_states(ids, positions, None, None, rows)
                network.step_graphs = None
                theirs, their_kv = network.hidden_states(ids, positions, None, None, rows)
            network.step_graphs = graphs
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
            for mine, compiled in zip(our_kv, their_kv, strict=True):
                torch.testing.assert_close(mine.keys, compiled.keys, rtol=0, atol=1e-5)
                torch.testing.assert_close(mine.values, compiled.values, rtol=0, atol=1e-5)
            kept.append((our_kv[0].keys.clone(), our_kv[0].keys))
    # No pass's keys changed under the passes after it.
    for snapshot, keys in kept:
        assert torch.equal(snapshot, keys)


def test_a_tree_after_a_cached_past_through_the_graphs(graphed_qwen3: DecoderModel, tiny_qwen3_reference: Any) -> None:
    """Questions continuing a cached state (a past) as a tree pass: the past is read beside the buffers' rows."""
    engine = TreeEngine(graphed_qwen3, prefix_cache=PrefixCache(64 << 20))
    state = tuple(range(30, 230))
    first = [ReadSpec(id=0, prompt=(*state, 5, 6), labels=((7,), (8, 9)))]
    engine.run(first)
    reads = [ReadSpec(id=1 + q, prompt=(*state, 11 + q, 12, 13 + q), labels=((7,), (8, 9))) for q in range(5)]
    outcome = engine.run(reads)
    assert sum(o.tokens_cached for o in outcome.outcomes) >= len(state)
    assert_equals_transformers(tiny_qwen3_reference, reads, outcome, 1e-5)


def test_off_and_cpu_capture_nothing(tiny_qwen3_dir: Path, graphed_qwen3: DecoderModel) -> None:
    graph = graphed_qwen3.network.graph
    assert graph is not None
    assert step_graphs.build(graph, "off", torch.device("cpu")) is None
    assert step_graphs.build(graph, "auto", torch.device("cpu")) is None  # no CUDA graphs on CPU
    with pytest.raises(ValueError, match="cuda graphs must be one of auto, off"):
        step_graphs.build(graph, "always", torch.device("cpu"))
    with pytest.raises(ValueError, match="cuda graphs must be one of auto, off"):
        load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", cuda_graphs="on"))


def test_the_batch_budget_bounds_the_buckets(graphed_qwen3: DecoderModel) -> None:
    graph = graphed_qwen3.network.graph
    assert graph is not None
    graphs = step_graphs.build(graph, "auto", torch.device("cpu"), max_tokens=300, capture=step_graphs.replay_eagerly)
    assert graphs is not None
    assert graphs.captured == (16, 32, 64, 128, 256, 384)  # 384 holds a pass of the whole budget


def test_the_capture_budget_keeps_the_largest_buckets_it_reached(graphed_qwen3: DecoderModel) -> None:
    graph = graphed_qwen3.network.graph
    assert graph is not None
    graphs = step_graphs.StepGraphs(graph, (16, 64, 256), step_graphs.replay_eagerly)
    # A budget spent after the first bucket: the largest is captured first, and only it is served.
    assert graphs.capture_all(budget_s=0.0) == (256,)
    assert graphs.bucket(10) == 256 and graphs.bucket(300) is None


def test_a_failed_capture_serves_the_compiled_layers_and_says_so(
    graphed_qwen3: DecoderModel, caplog: pytest.LogCaptureFixture
) -> None:
    graph = graphed_qwen3.network.graph
    assert graph is not None

    def broken(piece: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    with caplog.at_level(logging.WARNING, logger="decision_server.step_graphs"):
        assert step_graphs.build(graph, "auto", torch.device("cpu"), capture=broken) is None
    (warning,) = [r for r in caplog.records if "capture failed" in r.getMessage()]
    assert "stream is capturing" in warning.fields["error"]  # type: ignore[attr-defined]


def test_graphs_that_differ_from_the_compiled_pass_are_dropped(
    graphed_qwen3: DecoderModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The load-time check: a replay that computes other numbers (here: one that replays nothing) is never served."""
    network = graphed_qwen3.network
    kept = network.step_graphs

    def capture_wrong(piece: Any) -> Any:
        return lambda: None  # captured without error, replays nothing

    try:
        with caplog.at_level(logging.WARNING, logger="decision_server.decoder"):
            assert network.graph is not None
            graphs = step_graphs.StepGraphs(network.graph, (64,), capture_wrong)
            graphs.capture_all()
            assert not network._graphs_match(graphs)
        assert any("differs from the compiled one" in r.getMessage() for r in caplog.records)
    finally:
        network.step_graphs = kept


def test_graphs_that_match_the_compiled_pass_are_kept(
    graphed_qwen3: DecoderModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    network = graphed_qwen3.network
    kept = network.step_graphs
    real_build = step_graphs.build
    monkeypatch.setattr(
        step_graphs,
        "build",
        lambda graph, mode, device, max_tokens=None: real_build(
            graph, mode, device, max_tokens, step_graphs.replay_eagerly
        ),
    )
    try:
        assert network.capture_graphs("auto", max_tokens=100) == (16, 32, 64, 128)
        assert graphed_qwen3.cuda_graph_buckets == (16, 32, 64, 128)
        assert network.capture_graphs("off") == () and network.step_graphs is None
    finally:
        network.step_graphs = kept


def test_a_replay_that_fails_at_the_load_check_leaves_the_compiled_layers(
    graphed_qwen3: DecoderModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    network = graphed_qwen3.network
    kept = network.step_graphs

    def capture_failing(piece: Any) -> Any:
        def replay() -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return replay

    real_build = step_graphs.build
    monkeypatch.setattr(
        step_graphs,
        "build",
        lambda graph, mode, device, max_tokens=None: real_build(graph, mode, device, max_tokens, capture_failing),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="decision_server.decoder"):
            assert network.capture_graphs("auto") == ()
        assert network.step_graphs is None
        assert any("a graphed pass failed" in r.getMessage() for r in caplog.records)
    finally:
        network.step_graphs = kept


def test_the_shard_info_lists_the_captured_buckets(graphed_qwen3: DecoderModel, tiny_qwen3: Any, shard: Any) -> None:
    from decision_server.pb import decision_pb2

    for model, expected in ((graphed_qwen3, list(SMALL_BUCKETS)), (tiny_qwen3, [])):
        with shard(model, "tree") as stub:
            assert list(stub.Info(decision_pb2.InfoRequest(), timeout=30).cuda_graph_buckets) == expected
