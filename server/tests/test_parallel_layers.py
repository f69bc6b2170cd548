"""The tensor-parallel layers and the distributed log-softmax against plain torch, with ranks as threads.

A `ThreadGroup` runs each rank on a thread of this process and meets them at a barrier for every collective,
so uneven splits (9 heads over 2 ranks, 3 over 3) are checked in milliseconds; the real gloo group across
processes is exercised by test_tensor_parallel.py.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F

from decision_server.checkpoint import Checkpoint
from decision_server.decoder import DecoderLM
from decision_server.decoder_model import DecoderModel
from decision_server.distributed import CollectiveError, ShardGroup, partition
from decision_server.layers import (
    ColumnParallelLinear,
    MatmulProbe,
    RowParallelLinear,
    VocabParallelEmbedding,
    probe_matmul,
    resolve_matmul,
    vocab_parallel_scores,
)
from decision_server.model import ScoreRequest, wrap_module
from decision_server.prefix_cache import PrefixCache

R = TypeVar("R")
CPU = torch.device("cpu")


class _Exchange:
    """Where the threads of one simulated group leave and pick up each other's tensors."""

    def __init__(self, world_size: int) -> None:
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def gather(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor.detach().clone()
        self.barrier.wait()
        pieces = [piece for piece in self.slots if piece is not None]
        # Nobody may overwrite a slot for the next collective before every rank has read this one.
        self.barrier.wait()
        return pieces


class ThreadGroup(ShardGroup):
    def __init__(self, rank: int, world_size: int, exchange: _Exchange) -> None:
        super().__init__(rank, world_size, CPU)
        self._exchange = exchange

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return self._exchange.gather(self.rank, tensor)

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        pieces = self._exchange.gather(self.rank, tensor)
        result = pieces[0]
        for piece in pieces[1:]:
            if op == "sum":
                result = result + piece
            else:
                result = torch.maximum(result, piece) if op == "max" else torch.minimum(result, piece)
        tensor.copy_(result)
        return tensor


def run_ranks(world_size: int, work: Callable[[ShardGroup], R]) -> list[R]:
    """`work(group)` on every rank of a simulated group, results in rank order."""
    if world_size == 1:
        return [work(ShardGroup.single(CPU))]
    exchange = _Exchange(world_size)
    with ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [pool.submit(work, ThreadGroup(rank, world_size, exchange)) for rank in range(world_size)]
        return [future.result(timeout=120) for future in futures]


def test_partition_covers_everything_once_earlier_ranks_taking_the_remainder() -> None:
    assert [partition(9, 2, rank) for rank in range(2)] == [(0, 5), (5, 9)]
    assert [partition(3, 2, rank) for rank in range(2)] == [(0, 2), (2, 3)]
    for total in (1, 7, 49152, 151936):
        for world in (1, 2, 3, 4):
            spans = [partition(total, world, rank) for rank in range(world)]
            assert spans[0][0] == 0 and spans[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert max(e - s for s, e in spans) - min(e - s for s, e in spans) <= 1


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_column_then_row_parallel_equal_the_plain_linears(world_size: int) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 12, generator=generator)
    up_weight, up_bias = torch.randn(10, 12, generator=generator), torch.randn(10, generator=generator)
    down_weight, down_bias = torch.randn(12, 10, generator=generator), torch.randn(12, generator=generator)
    expected_up = F.linear(x, up_weight, up_bias)
    expected = F.linear(expected_up, down_weight, down_bias)

    def rank_work(group: ShardGroup) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = partition(10, group.world_size, group.rank)
        column = ColumnParallelLinear(up_weight[start:end].clone(), up_bias[start:end].clone())
        row = RowParallelLinear(down_weight[:, start:end].clone(), down_bias.clone(), group)
        local_up = column(x)
        return local_up, row(local_up)

    results = run_ranks(world_size, rank_work)
    # Column-parallel outputs are the plain output's columns, split; the row-parallel sum is whole on every rank.
    torch.testing.assert_close(torch.cat([up for up, _ in results], dim=-1), expected_up, rtol=0, atol=1e-6)
    for _, out in results:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_vocab_parallel_embedding_equals_the_whole_table(world_size: int) -> None:
    generator = torch.Generator().manual_seed(1)
    table = torch.randn(11, 4, generator=generator)
    ids = torch.tensor([0, 10, 5, 5, 3, 7, 1])

    def rank_work(group: ShardGroup) -> torch.Tensor:
        start, end = partition(11, group.world_size, group.rank)
        embedding = VocabParallelEmbedding(table[start:end].clone(), start, 11, group)
        vectors: torch.Tensor = embedding(ids)
        return vectors

    for vectors in run_ranks(world_size, rank_work):
        assert torch.equal(vectors, F.embedding(ids, table))


def _split_scores(
    logits: torch.Tensor, world_size: int, rows: list[int], tokens: list[int], greedy_rows: list[int]
) -> list[tuple[list[float], list[int]]]:
    vocab = logits.shape[1]

    def rank_work(group: ShardGroup) -> tuple[list[float], list[int]]:
        start, end = partition(vocab, group.world_size, group.rank)
        return vocab_parallel_scores(logits[:, start:end].clone(), start, group, rows, tokens, greedy_rows)

    return run_ranks(world_size, rank_work)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_distributed_log_softmax_equals_torch(world_size: int) -> None:
    generator = torch.Generator().manual_seed(2)
    vocab = 1001  # splits unevenly over 2, 3 and 4 ranks
    # Scaled like a real LM's logits (SmolLM2's reach 33), where float32 rounding is visible.
    logits = torch.randn(4, vocab, generator=generator) * 8 + 20
    rows = [0, 0, 1, 2, 3, 3, 3]
    tokens = [0, 1000, 500, 251, 750, 999, 333]
    expected = torch.log_softmax(logits.double(), dim=-1)
    for values, greedy in _split_scores(logits, world_size, rows, tokens, [0, 1, 2, 3]):
        assert values == pytest.approx([float(expected[r, t]) for r, t in zip(rows, tokens, strict=True)], abs=1e-5)
        assert greedy == logits.argmax(dim=-1).tolist()
    # Against torch's own float32 log_softmax, what the transformers fallback computes.
    values, _ = _split_scores(logits, world_size, rows, tokens, [0])[0]
    plain = torch.log_softmax(logits, dim=-1)
    assert values == pytest.approx([float(plain[r, t]) for r, t in zip(rows, tokens, strict=True)], abs=5e-5)


@pytest.mark.parametrize("world_size", [2, 3])
def test_greedy_ties_across_ranks_pick_the_smallest_index_like_argmax(world_size: int) -> None:
    logits = torch.zeros(2, 12)
    logits[0, [3, 7, 11]] = 5.0  # the maximum on several ranks
    logits[1, [8, 9]] = 2.0
    for _, greedy in _split_scores(logits, world_size, [], [], [0, 1]):
        assert greedy == [3, 8] == logits.argmax(dim=-1).tolist()


def test_checkpoint_reads_only_the_requested_slice(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    weight = torch.arange(60, dtype=torch.float32).view(6, 10)
    save_file({"w": weight, "b": torch.ones(6, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    with Checkpoint(tmp_path) as checkpoint:
        rows = checkpoint.read("w", torch.float32, CPU, dim=0, start=2, end=4)
        assert torch.equal(rows, weight[2:4])
        assert checkpoint.bytes_read == 2 * 10 * 4
        columns = checkpoint.read("w", torch.float32, CPU, dim=1, start=7, end=10)
        assert torch.equal(columns, weight[:, 7:10])
        assert checkpoint.bytes_read == (20 + 18) * 4
        assert checkpoint.read("b", torch.float32, CPU).dtype == torch.float32
        assert checkpoint.bytes_read == (20 + 18) * 4 + 6 * 2  # counted as stored: bfloat16
        with pytest.raises(ValueError, match="outside dimension 1"):
            checkpoint.read("w", torch.float32, CPU, dim=1, start=5, end=11)
        with pytest.raises(ValueError, match="no tensor named"):
            checkpoint.read("missing", torch.float32, CPU)


# Qwen3-0.6B's layer shapes (hidden 1024, 16 query / 8 key-value heads of 128, MLP 3072, q/k norms), two layers
# and a small vocabulary so the checkpoint builds in a second.
QWEN3_06B_LAYERS: dict[str, Any] = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "num_hidden_layers": 2,
    "vocab_size": 4099,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,  # the untied head path (the fixtures are tied)
}


@pytest.fixture(scope="module")
def qwen3_06b_shaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The checkpoint folder and transformers' model loaded from it."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("qwen3-06b-shaped")
    config = Qwen3Config(**QWEN3_06B_LAYERS)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(folder)
    # Random weights written directly: transformers' own initialisation of 40M parameters takes far longer.
    with torch.device("meta"):
        shapes = {name: tensor.shape for name, tensor in Qwen3ForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    weights = {
        name: (1.0 + 0.1 * torch.randn(shape, generator=generator))
        if name.endswith("norm.weight")
        else 0.05 * torch.randn(shape, generator=generator)
        for name, shape in shapes.items()
    }
    save_file(weights, str(folder / "model.safetensors"))
    module = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    return folder, module


def _decoder_on_ranks(folder: Path, world_size: int, request: ScoreRequest) -> list[Any]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)

    def rank_work(group: ShardGroup) -> Any:
        with Checkpoint(folder) as checkpoint:
            network = DecoderLM.load(checkpoint, config, group, torch.float32, CPU)
        model = DecoderModel(
            network=network,
            group=group,
            config=config,
            path=folder,
            device=CPU,
            dtype=torch.float32,
            architecture="Qwen3ForCausalLM",
            vocab_size=network.shape.vocab_size,
            embedding_rows=network.embedding.rows,
            max_position_embeddings=40960,
        )
        return model.weight_bytes(), model.score(request)

    return run_ranks(world_size, rank_work)


def test_qwen3_06b_shaped_layers_split_over_2_and_4_ranks_equal_transformers(qwen3_06b_shaped: Any) -> None:
    folder, module = qwen3_06b_shaped
    reference = wrap_module(module, folder, CPU, torch.float32)
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 4099, (40,), generator=generator).tolist()
    # A tree: tokens 25.. branch off after token 20 (they do not see 21..24), at positions continuing from 20.
    allowed = torch.tril(torch.ones(40, 40, dtype=torch.bool))
    allowed[25:, 21:25] = False
    positions = list(range(25)) + list(range(21, 36))
    labels = [5, 4098, 2048, 17, 3000, 1]
    request = ScoreRequest(
        token_ids=tokens,
        keep=[24, 39],
        label_rows=[0, 0, 0, 1, 1, 1],
        label_tokens=labels,
        greedy_rows=[0, 1],
        position_ids=positions,
        attention_mask=reference.tree_attention_mask(allowed),
        return_key_values=True,
    )
    expected = reference.score(request)
    assert expected.keys is not None
    whole_bytes = sum(p.numel() * 4 for p in module.parameters())
    for world_size in (1, 2, 4):
        ranks = _decoder_on_ranks(folder, world_size, request)
        for rank, (weight_bytes, scored) in enumerate(ranks):
            assert scored.label_logprobs == pytest.approx(expected.label_logprobs, abs=1e-4)
            assert scored.greedy_tokens == expected.greedy_tokens
            # Each rank holds its key/value heads only: 8 heads split evenly.
            heads = slice(rank * 8 // world_size, (rank + 1) * 8 // world_size)
            torch.testing.assert_close(scored.keys, expected.keys[:, heads], rtol=1e-4, atol=1e-4)
            # Weights split too: everything but the norms (a few KB, replicated) is divided among the ranks.
            assert weight_bytes == pytest.approx(whole_bytes / world_size, rel=0.01)
        assert len({tuple(scored.label_logprobs) for _, scored in ranks}) == 1, "ranks must agree exactly"


def test_ranks_sent_different_passes_fail_instead_of_mixing_results() -> None:
    def rank_work(group: ShardGroup) -> str:
        try:
            group.check_same("the forward pass", [10, group.rank])
        except CollectiveError as err:
            return str(err)
        return "agreed"

    assert all("ranks disagree on the forward pass" in outcome for outcome in run_ranks(2, rank_work))

    def agreeing(group: ShardGroup) -> str:
        group.check_same("the forward pass", [10, 3])
        return "agreed"

    assert run_ranks(2, agreeing) == ["agreed"] * 2


def test_prefix_caches_of_unevenly_split_ranks_evict_the_same_segments() -> None:
    # SmolLM2 over 2 ranks: rank 0 holds 2 of the 3 key/value heads, rank 1 holds 1. Counted at whole-model size,
    # both caches fill and evict in step although rank 0 stores twice the bytes of rank 1.
    def provider(heads: int, tokens: list[int]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        def provide(start: int) -> tuple[torch.Tensor, torch.Tensor]:
            keys = torch.zeros(2, heads, len(tokens) - start, 4)
            return keys, keys.clone()

        return provide

    caches = {
        2: PrefixCache(3 * 2 * 2 * 4 * 4 * 20, heads_share=(2, 3)),
        1: PrefixCache(3 * 2 * 2 * 4 * 4 * 20, (1, 3)),
    }
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 50, (int(n),), generator=generator).tolist() for n in torch.randint(3, 12, (30,))]
    for prompt in prompts:
        for heads, cache in caches.items():
            cache.match("", prompt)
            cache.insert("", prompt, provider(heads, prompt))
        assert caches[2].bytes_used == caches[1].bytes_used <= caches[2].capacity_bytes
        assert [caches[2].match("", p).length for p in prompts] == [caches[1].match("", p).length for p in prompts]
    assert caches[2].cached_tokens == caches[1].cached_tokens > 0


def test_bfloat16_linear_weights_are_prepacked_and_compute_what_f_linear_does() -> None:
    from decision_server.layers import bfloat16_packs, linear_weight_bytes

    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(48, 32, generator=generator).bfloat16()
    bias = torch.randn(48, generator=generator).bfloat16()
    x = torch.randn(7, 32, generator=generator).bfloat16()
    column = ColumnParallelLinear(weight, bias)
    row = RowParallelLinear(weight, None, ShardGroup.single(CPU))
    # Packed where the CPU converts bfloat16 natively; plain on AVX2-only CPUs, where packing used to fail the load.
    assert column.weight.is_mkldnn == bfloat16_packs()
    assert column.out_features == 48
    assert torch.equal(column(x), F.linear(x, weight, bias))
    assert torch.equal(row(x), F.linear(x, weight))
    # Packed weights are no parameters; the byte count still includes them, once each.
    holder = torch.nn.Sequential(column, row)
    packed = linear_weight_bytes(holder) + sum(p.numel() * p.element_size() for p in holder.parameters())
    assert packed == 2 * weight.numel() * 2 + bias.numel() * 2
    # float32 stays in torch's plain layout: it must equal the transformers reference to 1e-5.
    assert not ColumnParallelLinear(weight.float()).weight.is_mkldnn


def test_float32_linear_weights_are_prepacked_only_in_fast_mode() -> None:
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(96, 64, generator=generator)
    bias = torch.randn(96, generator=generator)
    x = torch.randn(11, 64, generator=generator)
    exact = ColumnParallelLinear(weight, bias)
    assert not exact.weight.is_mkldnn
    assert torch.equal(exact(x), F.linear(x, weight, bias))
    fast = ColumnParallelLinear(weight, bias, matmul="fast")
    row = RowParallelLinear(weight, None, ShardGroup.single(CPU), matmul="fast")
    assert fast.weight.is_mkldnn == row.weight.is_mkldnn == torch.backends.mkldnn.is_available()
    # Another summation order, not another result: float32 rounding apart.
    torch.testing.assert_close(fast(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(row(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exact, fast, split"):
        ColumnParallelLinear(weight, matmul="fastest")


@pytest.mark.parametrize(
    ("exact_ms", "fast_ms", "split_ms", "expected"),
    [
        (10.0, 6.0, None, "fast"),  # oneDNN 1.67x (Zen 4's margin)
        (10.0, 9.4, None, "fast"),  # 1.06x: past the 5 % margin
        (10.0, 9.6, None, "exact"),  # 1.04x: a near tie keeps the reference sums
        (10.0, 10.0, None, "exact"),
        (10.0, 12.0, None, "exact"),  # MKL faster (some Intel CPUs)
        (10.0, 10.5, 4.4, "split"),  # the bfloat16 split GEMM on AMX: 2.3x
        (10.0, 6.0, 5.9, "fast"),  # a step down in exactness must buy 5 % over the mode above it
        (10.0, 6.0, 5.0, "split"),
        (10.0, 12.0, 9.4, "split"),  # past exact's margin, and fast is slower than exact
        (10.0, 12.0, 9.6, "exact"),
        (10.0, None, 20.0, "exact"),  # bfloat16 slower than float32 (Zen 3, AVX2), and no oneDNN
    ],
)
def test_matmul_auto_runs_the_gemm_measured_fastest_on_this_cpu(
    monkeypatch: pytest.MonkeyPatch, exact_ms: float, fast_ms: float | None, split_ms: float | None, expected: str
) -> None:
    import decision_server.layers as layers

    asked: list[tuple[int, int, bool]] = []

    def probe(
        in_features: int, out_features: int, bfloat16_weights: bool = True, dtype: torch.dtype = torch.float32
    ) -> MatmulProbe:
        assert dtype == torch.float32
        asked.append((in_features, out_features, bfloat16_weights))
        measured = {"exact": exact_ms, "fast": fast_ms, "split": split_ms}
        seconds = {mode: ms / 1e3 for mode, ms in measured.items() if ms is not None}
        return MatmulProbe(seconds, (512, in_features, out_features))

    monkeypatch.setattr(layers, "probe_matmul", probe)
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144)) == expected
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), bfloat16_weights=False) == expected
    assert asked == [(1024, 6144, True), (1024, 6144, False)]  # timed at the shape and weights asked for
    # Nothing is timed where the mode changes nothing, or where it was chosen explicitly.
    assert resolve_matmul("auto", "cuda", torch.float32, (1024, 6144)) == "exact"
    assert resolve_matmul("auto", "cpu", torch.float64, (1024, 6144)) == "exact"  # no mode for float64
    assert [resolve_matmul(mode, "cpu") for mode in ("exact", "fast", "split")] == ["exact", "fast", "split"]
    assert len(asked) == 2
    monkeypatch.setattr(layers, "probe_matmul", lambda *args, **kwargs: None)  # neither oneDNN nor MKL's bfloat16
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144)) == "exact"
    with pytest.raises(ValueError, match="auto, exact, fast, split"):
        resolve_matmul("fastest")


def test_matmul_auto_decides_by_the_fastest_times_seen_on_this_machine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A load beside busy neighbours times every GEMM slow, and by their noise (AMX, 2026-12-03: exact 80, fast 64,
    split 88 ms against 14.5, 15.2 and 7.1 alone). With a record of this machine's earlier probes, each mode counts
    its fastest time seen, so the quiet load's choice stands."""
    import json

    import decision_server.layers as layers

    timings = iter([(14.5, 15.2, 7.1), (80.0, 64.0, 88.0), (80.0, 64.0, 88.0), (80.0, 64.0, 88.0)])

    def probe(in_features: int, out_features: int, **kwargs: Any) -> MatmulProbe:
        seconds = dict(zip(("exact", "fast", "split"), (ms / 1e3 for ms in next(timings)), strict=True))
        return MatmulProbe(seconds, (512, in_features, out_features))

    monkeypatch.setattr(layers, "probe_matmul", probe)
    record = tmp_path / "cache" / "matmul-probes.json"
    with caplog.at_level("INFO", logger="decision_server.layers"):
        assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), record=record) == "split"
        assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), record=record) == "split"
    kept = json.loads(record.read_text())
    ((key, entry),) = kept.items()
    assert f"{torch.get_num_threads()} threads" in key and "512x1024x6144" in key
    assert entry["probes"] == 2
    assert entry["seconds"] == pytest.approx({"exact": 14.5e-3, "fast": 15.2e-3, "split": 7.1e-3})
    fields = [r.fields for r in caplog.records if r.getMessage().startswith("matmul auto")]  # type: ignore[attr-defined]
    assert fields[1]["this_load_ms"] == {"exact": 80.0, "fast": 64.0, "split": 88.0}
    kept_ms = tuple(fields[1][name] for name in ("exact_ms", "fast_ms", "split_ms", "probes"))
    assert kept_ms == (14.5, 15.2, 7.1, 2)
    assert fields[1]["measured_fastest"] == fields[1]["matmul"] == "split"
    # Another thread count is another machine as far as GEMMs go: it times afresh, and decides by its own times.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), record=record) == "fast"
    assert len(json.loads(record.read_text())) == 2
    # A record that is not JSON is started anew.
    record.write_text("{not json")
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), record=record) == "fast"
    assert [entry["probes"] for entry in json.loads(record.read_text()).values()] == [1]


def test_matmul_auto_loads_when_its_record_cannot_be_written(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import decision_server.layers as layers

    measured = {"exact": 10e-3, "fast": 6e-3, "split": 20e-3}
    monkeypatch.setattr(layers, "probe_matmul", lambda k, n, **kwargs: MatmulProbe(measured, (512, k, n)))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level("WARNING", logger="decision_server.layers"):
        chosen = resolve_matmul("auto", "cpu", torch.float32, (1024, 6144), record=blocked / "matmul-probes.json")
    assert chosen == "fast"
    assert any("cannot keep the probe's times" in r.getMessage() for r in caplog.records)
    # Without a record nothing is written anywhere (the library default; the shard passes its cache directory's).
    assert resolve_matmul("auto", "cpu", torch.float32, (1024, 6144)) == "fast"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


class _OtherRankVotes:
    """A two-rank group as `resolve_matmul` sees it: the other rank's vote is fixed."""

    world_size = 2

    def __init__(self, other: str, modes: tuple[str, ...] = ("exact", "fast", "split")) -> None:
        self.other, self.modes = other, modes

    def all_reduce_min(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.minimum(tensor, torch.tensor([self.modes.index(self.other)]))


@pytest.mark.parametrize(
    ("here", "other", "expected"),
    [
        ("fast", "fast", "fast"),
        ("fast", "exact", "exact"),
        ("exact", "fast", "exact"),
        ("exact", "exact", "exact"),
        ("split", "split", "split"),
        ("split", "fast", "fast"),
        ("exact", "split", "exact"),
    ],
)
def test_matmul_auto_runs_one_mode_on_every_rank(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, here: str, other: str, expected: str
) -> None:
    """Each rank times its own share; the group runs the most exact of the modes its ranks chose."""
    import decision_server.layers as layers

    measured = {"exact": 10e-3, "fast": 6e-3 if here == "fast" else 12e-3, "split": 4e-3 if here == "split" else 20e-3}
    monkeypatch.setattr(layers, "probe_matmul", lambda k, n, **kwargs: MatmulProbe(measured, (512, k, n)))
    group: Any = _OtherRankVotes(other)
    with caplog.at_level("INFO", logger="decision_server.layers"):
        assert resolve_matmul("auto", "cpu", torch.float32, (1024, 3072), group) == expected
    (record,) = [r for r in caplog.records if r.getMessage().startswith("matmul auto")]
    fields = record.fields  # type: ignore[attr-defined]
    assert (fields["measured_fastest"], fields["matmul"]) == (here, expected)
    assert (fields["exact_ms"], fields["fast_ms"], fields["split_ms"]) == tuple(
        round(measured[mode] * 1e3, 2) for mode in ("exact", "fast", "split")
    )


def test_probe_matmul_times_every_gemm_this_cpu_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = probe_matmul(256, 100_000, rows=64, rounds=2)
    assert probe is not None  # MKL's bfloat16 GEMM ships in PyPI's x86 torch
    expected = {"exact", "split"} | ({"fast"} if torch.backends.mkldnn.is_available() else set())
    assert set(probe.seconds) == expected and all(seconds > 0 for seconds in probe.seconds.values())
    assert probe.shape == (64, 256, 4096)  # capped so a large model's probe stays short
    assert probe_matmul(8192, 8192, rows=8, rounds=1).shape == (8, 4096, 2048)  # type: ignore[union-attr]
    assert probe.choice in expected
    assert probe_matmul(256, 512, rows=8, rounds=1, bfloat16_weights=False) is not None
    monkeypatch.setenv("DECISION_PLAIN_MATMUL", "1")  # weights stay plain: only exact can run
    assert probe_matmul(256, 256) is None


def test_bfloat16_stays_plain_where_the_cpu_cannot_pack_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import decision_server.layers as layers

    # AVX2-only CPUs: oneDNN refuses to pack bfloat16 ("bf16 path needs the cpu support avx_ne_convert or
    # avx512bw…"), which used to fail the shard's load; there the weight stays plain and F.linear runs it.
    monkeypatch.setattr(layers, "bfloat16_packs", lambda: False)
    weight = torch.randn(8, 4).bfloat16()
    x = torch.randn(3, 4).bfloat16()
    column = ColumnParallelLinear(weight, matmul="fast")
    assert not column.weight.is_mkldnn
    assert torch.equal(column(x), F.linear(x, weight))


def test_half_gemm_is_slow_where_onednn_has_no_kernel_for_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    import decision_server.layers as layers

    assert not layers.half_gemm_is_slow(torch.float32)  # float32 has a fast GEMM on every CPU
    assert layers.half_gemm_is_slow(torch.bfloat16) == (not layers.bfloat16_packs())
    assert layers.half_gemm_is_slow(torch.float16) == (not torch.ops.mkldnn._is_mkldnn_fp16_supported())
    for packs in (True, False):
        monkeypatch.setattr(layers, "bfloat16_packs", lambda packs=packs: packs)
        assert layers.half_gemm_is_slow(torch.bfloat16) == (not packs)


def test_plain_matmul_env_keeps_bfloat16_unpacked(monkeypatch: pytest.MonkeyPatch) -> None:
    from decision_server.layers import PLAIN_MATMUL_ENV

    monkeypatch.setenv(PLAIN_MATMUL_ENV, "1")
    weight = torch.randn(8, 4).bfloat16()
    assert not ColumnParallelLinear(weight).weight.is_mkldnn


def test_bfloat16_decoder_counts_its_packed_weights(smollm2_dir: Path) -> None:
    from decision_server.model import LoadOptions, load_model

    bf16 = load_model(smollm2_dir, LoadOptions(dtype="bfloat16"))
    # Half of the float32 count (test_decoder.py): every weight counted, packed or not, tied ones once.
    assert bf16.weight_bytes() == 538_060_032 // 2


def test_the_shard_keeps_its_matmul_record_in_the_cache_directory_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from decision_server.paths import MATMUL_RECORD_ENV, matmul_record

    monkeypatch.delenv(MATMUL_RECORD_ENV, raising=False)
    monkeypatch.setenv("DECISION_CACHE_DIR", str(tmp_path / "cache"))
    assert matmul_record() == tmp_path / "cache" / "matmul-probes.json"
    monkeypatch.setenv(MATMUL_RECORD_ENV, str(tmp_path / "volume" / "probes.json"))  # the image: /data
    assert matmul_record() == tmp_path / "volume" / "probes.json"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widened_half_precision_weights_multiply_the_same_values_in_float32(dtype: torch.dtype) -> None:
    """`--matmul widen`: the weights held in float32 (exactly), float32 GEMMs on the widened activations, outputs
    rounded to the model's dtype: the products the dtype's own GEMM computes, summed in float32 in another order."""
    from decision_server.layers import WideWeight, linear_weight_bytes

    generator = torch.Generator().manual_seed(9)
    weight = (torch.randn(96, 64, generator=generator) * 0.125).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    x = torch.randn(13, 64, generator=generator).to(dtype)
    column = ColumnParallelLinear(weight, bias, matmul="widen")
    row = RowParallelLinear(weight, None, ShardGroup.single(CPU), matmul="widen")
    assert isinstance(column.weight, WideWeight) and column.weight.dtype == dtype
    assert column.weight.weight.dtype == torch.float32 and torch.equal(column.weight.weight, weight.float())
    assert column.out_features == 96
    wide = column(x)
    assert wide.dtype == dtype and wide.shape == (13, 96)
    assert torch.equal(wide, F.linear(x.float(), weight.float(), bias.float()).to(dtype))
    assert torch.equal(row(x), F.linear(x.float(), weight.float()).to(dtype))
    # Against float64 sums of the same values: within the dtype's own rounding of the output, like its own GEMM.
    reference = F.linear(x.double(), weight.double(), bias.double())
    native = F.linear(x, weight, bias)
    ulp = {torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    bound = ulp * reference.abs() + 1e-6
    assert bool(((wide.double() - reference).abs() <= bound).all())
    assert bool(((native.double() - reference).abs() <= 2 * bound).all())
    # Packed weights are counted at their float32 size: twice the dtype's.
    assert linear_weight_bytes(torch.nn.Sequential(column, row)) == 2 * weight.numel() * 4
    # A float32 weight has nothing to widen: it stays as it is.
    assert not isinstance(ColumnParallelLinear(weight.float(), matmul="widen").weight, WideWeight)


@pytest.mark.parametrize(
    ("exact_ms", "widen_ms", "fits", "expected"),
    [
        (10.0, 5.6, True, "widen"),  # an Intel Xeon without AMX: oneDNN's bfloat16 at 0.56x float32
        (10.0, 9.6, True, "exact"),  # 1.04x: a near tie keeps the dtype's own GEMM
        (2.0, 10.0, True, "exact"),  # AMX or Zen 4: bfloat16 well ahead
        (10.0, 1.5, False, "exact"),  # faster, but the float32 copies would not fit: nothing is timed
    ],
)
def test_matmul_auto_in_half_precision_widens_only_where_float32_is_faster_and_fits(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    exact_ms: float,
    widen_ms: float,
    fits: bool,
    expected: str,
) -> None:
    import json

    import decision_server.layers as layers

    asked: list[torch.dtype] = []

    def probe(in_features: int, out_features: int, bfloat16_weights: bool = True, **kwargs: Any) -> MatmulProbe:
        asked.append(kwargs["dtype"])
        seconds = {"exact": exact_ms / 1e3, "widen": widen_ms / 1e3}
        return MatmulProbe(seconds, (512, in_features, out_features), str(kwargs["dtype"]).removeprefix("torch."))

    monkeypatch.setattr(layers, "probe_matmul", probe)
    record = tmp_path / "matmul-probes.json"
    for dtype in (torch.bfloat16, torch.float16):
        with caplog.at_level("INFO", logger="decision_server.layers"):
            chosen = resolve_matmul("auto", "cpu", dtype, (1024, 6144), record=record, widen_fits=fits)
        assert chosen == expected
    assert asked == ([torch.bfloat16, torch.float16] if fits else [])
    if fits:
        # Each dtype keeps its own times, apart from the float32 GEMMs' (whose keys stay as they were).
        keys = sorted(json.loads(record.read_text()))
        assert [key.rsplit(" | ", 1)[-1] for key in keys] == ["bfloat16", "float16"]
        fields = [r.fields for r in caplog.records if r.getMessage().startswith("matmul auto")]  # type: ignore[attr-defined]
        assert [f["dtype"] for f in fields] == ["bfloat16", "float16"]
        assert all(f["matmul"] == expected and f["widen_ms"] == widen_ms for f in fields)
        assert caplog.records[0].getMessage() == "matmul auto: timed the bfloat16 GEMMs on this CPU"
    # Off the CPU nothing is timed, and an explicit mode is taken as it is.
    assert resolve_matmul("auto", "cuda", torch.bfloat16, (1024, 6144)) == "exact"
    assert resolve_matmul("widen", "cpu", torch.bfloat16) == "widen"
    assert len(asked) == (2 if fits else 0)


def test_matmul_widen_is_refused_for_float32_models() -> None:
    with pytest.raises(ValueError, match="--matmul widen applies to bfloat16 and float16 models"):
        resolve_matmul("widen", "cpu", torch.float32)


@pytest.mark.parametrize(("here", "other", "expected"), [("widen", "widen", "widen"), ("widen", "exact", "exact")])
def test_matmul_auto_widens_on_every_rank_or_on_none(
    monkeypatch: pytest.MonkeyPatch, here: str, other: str, expected: str
) -> None:
    import decision_server.layers as layers

    measured = {"exact": 10e-3, "widen": 5e-3 if here == "widen" else 20e-3}
    monkeypatch.setattr(layers, "probe_matmul", lambda k, n, **kwargs: MatmulProbe(measured, (512, k, n), "bfloat16"))
    group: Any = _OtherRankVotes(other, ("exact", "widen"))
    assert resolve_matmul("auto", "cpu", torch.bfloat16, (1024, 3072), group) == expected


def test_widening_must_fit_in_half_the_free_memory() -> None:
    from decision_server.layers import WIDEN_MEMORY_SHARE, widen_fits_memory

    assert WIDEN_MEMORY_SHARE == 0.5
    gib = 1 << 30
    assert widen_fits_memory(1 * gib, 2 * gib) and widen_fits_memory(0, 0)
    assert not widen_fits_memory(1 * gib + 1, 2 * gib)
    assert not widen_fits_memory(16 * gib, 24 * gib)  # an 8B model's linears in bfloat16 on a 24 GB machine


def test_probe_matmul_times_the_half_precision_gemm_against_the_widened_one() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        probe = probe_matmul(256, 512, rows=16, rounds=2, dtype=dtype)
        assert probe is not None and probe.dtype == str(dtype).removeprefix("torch.")
        assert set(probe.seconds) == {"exact", "widen"} and all(s > 0 for s in probe.seconds.values())
        assert probe.choice in ("exact", "widen")
