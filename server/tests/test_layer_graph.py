"""The decoder's layers between attentions as compiled graphs (`layer_graph`, `--compile auto`): that they run on
every kind of pass (a causal chain, a tree after a cached prefix, a packed batch of many requests, kept rows), that
every read stays equal to an independent transformers forward, that packed or split `--matmul` weights go through
the held-weight op, and that a failure to compile, or a model split over ranks, runs eagerly."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import reference_sequence_logprob, use_segment_kernel
from test_packed_batches import assert_equals_transformers, many_requests

from decision_server import layer_graph
from decision_server.decoder_model import DecoderModel
from decision_server.engines import ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def compiled_qwen3(tiny_qwen3_dir: Path) -> DecoderModel:
    model = load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", compile_mode="auto"))
    assert isinstance(model, DecoderModel)
    return model


def count_steps(model: DecoderModel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the token count of every compiled step the model runs."""
    graph = model.network.graph
    assert graph is not None
    steps: list[int] = []
    step = graph.step

    def counted(index: int, hidden: torch.Tensor, *args: Any) -> Any:
        steps.append(hidden.shape[0])
        return step(index, hidden, *args)

    monkeypatch.setattr(graph, "step", counted)
    return steps


def test_compile_auto_compiles_the_layers_and_off_does_not(compiled_qwen3: DecoderModel, tiny_qwen3: Any) -> None:
    assert compiled_qwen3.network.graph is not None
    assert len(compiled_qwen3.network.graph.layers) == len(compiled_qwen3.network.layers)
    assert tiny_qwen3.network.graph is None  # load_model's default, `--compile off`


@pytest.mark.parametrize("kernel", ["split", "sdpa", "flex"], ids=["cpu-kernels", "sdpa-per-segment", "flex-one-call"])
def test_a_packed_batch_through_the_compiled_layers_equals_transformers(
    compiled_qwen3: DecoderModel, tiny_qwen3_reference: Any, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Many requests in one pass (segments, a shared head from the prefix cache, trees of questions, kept rows)."""
    use_segment_kernel(monkeypatch, compiled_qwen3, kernel)
    steps = count_steps(compiled_qwen3, monkeypatch)
    engine = TreeEngine(compiled_qwen3, prefix_cache=PrefixCache(64 << 20), min_split_tokens=64)
    cold = many_requests(requests=6, state_tokens=90, questions=3)
    first = engine.run(cold)
    assert first.forward_passes == 1
    assert_equals_transformers(tiny_qwen3_reference, cold, first, 1e-5)
    layers = len(compiled_qwen3.network.layers)
    assert len(steps) == layers - 1  # every layer but the last leaves through one compiled step
    # Warm: the head and states come from the cache (a past), new requests beside them.
    warm = many_requests(requests=6, state_tokens=90, questions=3) + many_requests(3, 40, 2, seed=9)
    second = engine.run(warm)
    assert_equals_transformers(tiny_qwen3_reference, warm, second, 1e-5)


def test_a_causal_chain_and_a_tree_equal_the_eager_layers(
    compiled_qwen3: DecoderModel, tiny_qwen3: DecoderModel
) -> None:
    """The compiled and the eager decoder over the same weights: hidden states, keys and values, kept rows."""
    generator = torch.Generator().manual_seed(4)
    tokens = 300
    ids = torch.randint(5, 400, (tokens,), generator=generator)
    positions = torch.arange(tokens)
    # A tree: a 200-token chain, then two branches of 50 that see it and not each other.
    allowed = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    allowed[250:, 200:250] = False
    for mask in (None, allowed[None, None]):
        for keep in (None, [3, 199, 249, 299]):
            with torch.inference_mode():
                theirs, their_kv = tiny_qwen3.network.hidden_states(ids, positions, mask, None, keep)
                ours, our_kv = compiled_qwen3.network.hidden_states(ids, positions, mask, None, keep)
            torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-5)
            for mine, eager in zip(our_kv, their_kv, strict=True):
                torch.testing.assert_close(mine.keys, eager.keys, rtol=0, atol=2e-5)
                torch.testing.assert_close(mine.values, eager.values, rtol=0, atol=2e-5)


def test_one_token_runs_eagerly(compiled_qwen3: DecoderModel, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = count_steps(compiled_qwen3, monkeypatch)
    with torch.inference_mode():
        compiled_qwen3.network.hidden_states(torch.tensor([7]), torch.tensor([0]), None, None)
    assert steps == []  # a single row would specialise a graph of its own


def test_packed_weights_go_through_the_held_weight_op(tiny_qwen3_dir: Path, tiny_qwen3: DecoderModel) -> None:
    """`--matmul fast` holds oneDNN-packed weights the compiler cannot take: each stands in the graph as its slot."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not available in this torch build")
    fast = load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", matmul="fast", compile_mode="auto"))
    assert isinstance(fast, DecoderModel) and fast.network.graph is not None
    weights = fast.network.graph.layers[0]
    assert weights.qkv.dtype == torch.int64 and weights.qkv.dim() == 0  # a slot, not the packed tensor
    read = ReadSpec(id=0, prompt=tuple(range(20, 120)), labels=((7,), (8, 9)))
    ours = TreeEngine(fast).run([read]).outcomes[0].label_logprobs
    eager = TreeEngine(tiny_qwen3).run([read]).outcomes[0].label_logprobs
    # oneDNN sums in another order than MKL (as test_decoder's fast-matmul test allows).
    assert ours == pytest.approx(eager, abs=2e-4)


def test_a_failed_compile_runs_eagerly_and_says_so(
    tiny_qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(layer_graph, "_probe", broken)
    with caplog.at_level(logging.WARNING, logger="decision_server.layer_graph"):
        model = load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", compile_mode="auto"))
    assert isinstance(model, DecoderModel) and model.network.graph is None
    (warning,) = [r for r in caplog.records if "cannot compile the decoder's layers" in r.getMessage()]
    assert "no C++ compiler" in warning.fields["error"]  # type: ignore[attr-defined]
    read = ReadSpec(id=0, prompt=tuple(range(20, 60)), labels=((7,),))
    assert TreeEngine(model).run([read]).outcomes[0].label_logprobs


def test_a_model_split_over_ranks_keeps_eager_layers(tiny_qwen3: DecoderModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row-parallel all-reduce stays eager: at world size 2 the layers are not compiled."""
    monkeypatch.setattr(tiny_qwen3.network.head, "group", SimpleNamespace(world_size=2))
    assert not tiny_qwen3.network.compile_layers()
    assert tiny_qwen3.network.graph is None


def test_smollm2_through_the_compiled_layers_stays_close_to_transformers(
    smollm2_dir: Path, smollm2_reference: Any
) -> None:
    """The real model, 30 layers: inductor's fused norms and activation sum in their own order (measured: 1.7e-5 in
    log-probability at most on a 512-token tree read), the same class of difference as `--matmul fast`'s."""
    model = load_model(smollm2_dir, LoadOptions(dtype="float32", matmul="exact", compile_mode="auto"))
    assert isinstance(model, DecoderModel) and model.network.graph is not None
    generator = torch.Generator().manual_seed(11)
    state = tuple(torch.randint(100, 40000, (120,), generator=generator).tolist())
    reads = [
        ReadSpec(
            id=i,
            prompt=state + tuple(torch.randint(100, 40000, (5,), generator=generator).tolist()),
            labels=((28,), (29, 30)),
        )
        for i in range(3)
    ]
    outcomes = TreeEngine(model).run(reads).outcomes
    for read, outcome in zip(reads, outcomes, strict=True):
        prompt = list(read.prompt)
        expected = [reference_sequence_logprob(smollm2_reference, prompt, list(label)) for label in read.labels]
        assert outcome.label_logprobs == pytest.approx(expected, abs=5e-5)


def test_the_shard_info_says_whether_the_layers_run_compiled(
    compiled_qwen3: DecoderModel, tiny_qwen3: DecoderModel, shard: Any
) -> None:
    """`GET /info`'s `compiled_layers` comes from the shard's Info."""
    from decision_server.pb import decision_pb2

    for model, expected in ((compiled_qwen3, True), (tiny_qwen3, False)):
        with shard(model, "tree") as stub:
            assert stub.Info(decision_pb2.InfoRequest(), timeout=30).compiled_layers is expected


def test_served_reads_never_compile_after_load(tiny_qwen3_dir: Path) -> None:
    """The probe at load leaves graphs whose token dimension is dynamic and that take inference-mode tensors, as
    served passes are: a first read of any length compiles nothing (it did: probe tensors made outside inference mode
    and outputs whose layout hung on tokens == heads made a 3-token read compile both graphs again, seconds on a busy
    CPU, past a client's deadline)."""
    from torch._dynamo.utils import counters

    from decision_server.engines import make_engine

    model = load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", compile_mode="auto"))
    graphs = counters["stats"]["unique_graphs"]
    for mode in ("naive", "tree"):
        engine = make_engine(mode, model, 0)
        # Token counts equal to the model's widths (2 key/value heads, 4 heads, 16 per head) included.
        for prompt in ((9707, 11, 1879), (5, 6), (5, 6, 7, 8), tuple(range(100, 116)), tuple(range(100, 400))):
            engine.run([ReadSpec(id=3, prompt=prompt, labels=((0,), (16, 17)))])
    assert counters["stats"]["unique_graphs"] == graphs
