"""The shard's own decoder at world size 1 equals transformers' modeling of the same checkpoint, pass for pass;
architectures it does not implement fall back to transformers at world size 1 and are refused above it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from decision_server import layers
from decision_server.decoder import UnsupportedModelError
from decision_server.decoder_model import DecoderModel
from decision_server.distributed import ParallelConfig
from decision_server.model import LoadedModel, LoadOptions, ScoreRequest, TransformersModel, load_model, wrap_module
from decision_server.split_gemm import SplitWeight

MODELS = ("smollm2", "tiny_qwen3")
CPU = torch.device("cpu")


def _requests(model: LoadedModel, length: int = 48) -> list[ScoreRequest]:
    """A plain prefill, then a tree pass (a branch that skips tokens, positions restarting), both over many rows."""
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, model.token_limit, (length,), generator=generator).tolist()
    labels = torch.randint(0, model.token_limit, (8,), generator=generator).tolist()
    keep = [10, 30, length - 1]
    plain = ScoreRequest(
        token_ids=tokens,
        keep=keep,
        label_rows=[0, 0, 1, 1, 2, 2, 2, 2],
        label_tokens=labels,
        greedy_rows=[0, 1, 2],
    )
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool))
    allowed[31:, 20:31] = False
    positions = list(range(31)) + list(range(20, 20 + length - 31))
    tree = ScoreRequest(
        token_ids=tokens,
        keep=keep,
        label_rows=plain.label_rows,
        label_tokens=labels,
        greedy_rows=[0, 1, 2],
        position_ids=positions,
        attention_mask=model.tree_attention_mask(allowed),
    )
    return [plain, tree]


@pytest.mark.parametrize("name", MODELS)
def test_decoder_equals_transformers_forward(request: pytest.FixtureRequest, name: str) -> None:
    model = request.getfixturevalue(name)
    assert isinstance(model, DecoderModel), "Llama and Qwen3 run on the shard's own decoder at every world size"
    assert (model.rank, model.world_size, model.kv_heads_share) == (0, 1, (model.network.shape.kv_heads,) * 2)
    reference = wrap_module(request.getfixturevalue(f"{name}_reference"), model.path, CPU, torch.float32)
    for scored_request in _requests(model):
        ours, theirs = model.score(scored_request), reference.score(scored_request)
        assert ours.label_logprobs == pytest.approx(theirs.label_logprobs, abs=1e-4)
        assert ours.greedy_tokens == theirs.greedy_tokens


def test_rotary_on_the_token_major_layout_is_bit_equal_to_rotate_half() -> None:
    from decision_server.decoder import _rotate

    generator = torch.Generator().manual_seed(3)
    # A strided (tokens, heads, head_dim) view of a fused projection, as the attention gets it.
    fused = torch.randn(37, 3 * 4 * 16, generator=generator)
    x = fused[:, 4 * 16 : 2 * 4 * 16].view(37, 4, 16)
    angles = torch.rand(37, 8, generator=generator) * 40
    doubled = torch.cat((angles, angles), dim=-1)
    cos, sin = doubled.cos(), doubled.sin()
    # transformers' formula: x * cos + rotate_half(x) * sin, on the (heads, tokens, head_dim) layout.
    heads_first = x.transpose(0, 1)
    turned = torch.cat((-heads_first[..., 8:], heads_first[..., :8]), dim=-1)
    expected = heads_first * cos + turned * sin
    assert torch.equal(_rotate(x, cos, sin).transpose(0, 1), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_bit_equal_to_the_reference_formula(dtype: torch.dtype) -> None:
    from decision_server.decoder import RMSNorm

    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(64, generator=generator).to(dtype)
    # Contiguous rows and a strided view of per-head slices (q_norm/k_norm).
    rows = (torch.randn(9, 64, generator=generator) * 3).to(dtype)
    heads = (torch.randn(9, 3 * 64, generator=generator) * 3).to(dtype)[:, 64:].reshape(9, 2, 64)
    for x in (rows, heads):
        wide = x.float()
        expected = weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        assert torch.equal(RMSNorm(weight, 1e-6)(x), expected)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "past_tokens", "tokens"), [(4, 2, 37, 21), (4, 2, 21, 37), (3, 3, 1, 2), (8, 1, 5, 300)]
)
def test_causal_attention_after_a_past_equals_the_masked_softmax(
    heads: int, kv_heads: int, past_tokens: int, tokens: int
) -> None:
    from decision_server.decoder import LayerKV, _causal_after_past

    generator = torch.Generator().manual_seed(heads * 100 + tokens)

    def draw(rows: int, length: int) -> torch.Tensor:
        return torch.randn(rows, length, 16, generator=generator, dtype=torch.float64).float()

    query, past = draw(heads, tokens), LayerKV(draw(kv_heads, past_tokens), draw(kv_heads, past_tokens))
    new = LayerKV(draw(kv_heads, tokens), draw(kv_heads, tokens))
    ours = _causal_after_past(query, new, past, 0.25)
    # The reference: one softmax over past + new keys in float64, new token i seeing the past and new tokens <= i.
    keys = torch.cat((past.keys, new.keys), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    values = torch.cat((past.values, new.values), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    scores = query.double() @ keys.transpose(1, 2) * 0.25
    allowed = torch.arange(tokens).unsqueeze(-1) + past_tokens >= torch.arange(past_tokens + tokens)
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ values
    assert ours.dtype == torch.float32 and ours.shape == (heads, tokens, 16)
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=2e-6)


def _causal_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax attention in float64: query i (of the last query.shape[1] positions) sees keys 0 .. offset + i."""
    tokens, length = query.shape[1], keys.shape[1]
    group = query.shape[0] // keys.shape[0]
    scores = query.double() @ keys.double().repeat_interleave(group, dim=0).transpose(1, 2) * scale
    allowed = torch.arange(tokens).unsqueeze(-1) + (length - tokens) >= torch.arange(length)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return weights @ values.double().repeat_interleave(group, dim=0)


@pytest.mark.parametrize(
    ("offset", "tokens", "pieces"),
    [(0, 400, 3), (30, 400, 3), (0, 385, 3), (0, 150, 1), (30, 150, 1), (0, 1030, 1), (900, 200, 1)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_a_causal_chain_in_pieces_equals_the_masked_softmax(
    monkeypatch: pytest.MonkeyPatch, offset: int, tokens: int, pieces: int, dtype: torch.dtype, head_dim: int
) -> None:
    """`_causal_chain` attends chains of 193-1,024 tokens in pieces (torch's kernel computes a 512-key block for
    every query block otherwise): masked flash calls in bfloat16, batched GEMMs in float32 where the queries are at
    least GEMM_CHAIN_MIN_WIDTH wide (4 heads of 128 here) and one flash call where they are narrower (4 of 16).
    Either way it stays the softmax over exactly the keys each query may see."""
    from decision_server import decoder

    generator = torch.Generator().manual_seed(offset * 1000 + tokens)
    query = torch.randn(4, tokens, head_dim, generator=generator).to(dtype)
    keys, values = (torch.randn(2, offset + tokens, head_dim, generator=generator).to(dtype) for _ in range(2))
    wide = 4 * head_dim >= decoder.GEMM_CHAIN_MIN_WIDTH
    masks: list[tuple[int, int]] = []
    gemm_calls: list[int] = []
    piece_mask, gemm_chain = decoder._piece_mask, decoder._gemm_chain
    monkeypatch.setattr(
        decoder, "_piece_mask", lambda rows, seen, kind: masks.append((rows, seen)) or piece_mask(rows, seen, kind)
    )
    monkeypatch.setattr(decoder, "_gemm_chain", lambda *args: gemm_calls.append(1) or gemm_chain(*args))
    scale = head_dim**-0.5
    ours = decoder._causal_chain(query, keys, values, scale)
    assert ours.dtype == dtype and ours.shape == (4, tokens, head_dim)
    if dtype == torch.float32:
        assert (len(gemm_calls), len(masks)) == ((1 if pieces > 1 and wide else 0), 0)
    else:
        # Every piece but one from position 0 is a masked call over the keys up to its end.
        assert not gemm_calls and len(masks) == (pieces - 1 if offset == 0 else pieces if pieces > 1 else 0)
        assert all(seen <= offset + tokens and rows <= decoder.CHAIN_PIECE_TOKENS for rows, seen in masks)
    expected = _causal_reference(query, keys, values, scale)
    # bfloat16: the kernel rounds its output (and the probabilities before the value product) to bfloat16.
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=2e-6 if dtype == torch.float32 else 3e-2)


def test_gemm_chain_reads_strided_heads_as_the_decoder_passes_them() -> None:
    """The decoder's queries, keys and values are (heads, tokens, head_dim) views of token-major projections."""
    from decision_server.decoder import _gemm_chain

    generator = torch.Generator().manual_seed(7)
    tokens, offset = 300, 20
    query = torch.randn(tokens, 8, 32, generator=generator).transpose(0, 1)
    keys, values = (torch.randn(offset + tokens, 2, 32, generator=generator).transpose(0, 1) for _ in range(2))
    expected = _causal_reference(query, keys, values, 32**-0.5)
    torch.testing.assert_close(_gemm_chain(query, keys, values, 32**-0.5).double(), expected, rtol=0, atol=2e-6)


def test_chain_pieces_cover_the_chain_in_order() -> None:
    from decision_server.decoder import CHAIN_PIECE_TOKENS, MAX_PIECED_CHAIN_TOKENS, _chain_pieces

    for offset, tokens in [(0, 193), (0, 540), (30, 540), (0, MAX_PIECED_CHAIN_TOKENS), (24, 1000)]:
        pieces = _chain_pieces(tokens, offset)
        assert pieces[0][0] == 0 and pieces[-1][1] == tokens and len(pieces) == -(-tokens // CHAIN_PIECE_TOKENS)
        assert all(end == start for (_, end), (start, _) in itertools.pairwise(pieces))
        assert all(0 < end - start <= CHAIN_PIECE_TOKENS for start, end in pieces)
    # Short chains, and chains past the limit (a tie there: bench/results/2026-12-05-zen4/), stay one call.
    assert _chain_pieces(CHAIN_PIECE_TOKENS, 0) == [(0, CHAIN_PIECE_TOKENS)]
    assert _chain_pieces(MAX_PIECED_CHAIN_TOKENS + 1, 0) == [(0, MAX_PIECED_CHAIN_TOKENS + 1)]
    assert _chain_pieces(500, MAX_PIECED_CHAIN_TOKENS - 499) == [(0, 500)]


def test_fast_matmul_decoder_stays_close_to_transformers(smollm2_dir: Path, smollm2_reference: Any) -> None:
    fast = load_model(smollm2_dir, LoadOptions(dtype="float32", matmul="fast"))
    assert isinstance(fast, DecoderModel) and fast.matmul == "fast"  # what Info reports
    packed = [layer.mlp.gate_up.weight.is_mkldnn for layer in fast.network.layers]
    assert all(packed) == torch.backends.mkldnn.is_available()
    reference = wrap_module(smollm2_reference, fast.path, CPU, torch.float32)
    for scored_request in _requests(fast):
        ours, theirs = fast.score(scored_request), reference.score(scored_request)
        # oneDNN sums in another order than MKL: a few 1e-5 over SmolLM2's 30 layers, never a different answer.
        assert ours.label_logprobs == pytest.approx(theirs.label_logprobs, abs=2e-4)
        assert ours.greedy_tokens == theirs.greedy_tokens


def test_split_matmul_decoder_stays_close_to_transformers(smollm2_dir: Path, smollm2_reference: Any) -> None:
    split = load_model(smollm2_dir, LoadOptions(dtype="float32", matmul="split"))
    assert isinstance(split, DecoderModel) and split.matmul == "split"  # what Info reports
    # SmolLM2 is stored in bfloat16, so each weight is exact in one bfloat16 part: two GEMMs per linear.
    assert all(len(layer.mlp.gate_up.weight.parts) == 1 for layer in split.network.layers)
    reference = wrap_module(smollm2_reference, split.path, CPU, torch.float32)
    worst = 0.0
    for scored_request in _requests(split):
        ours, theirs = split.score(scored_request), reference.score(scored_request)
        worst = max(worst, *(abs(a - b) for a, b in zip(ours.label_logprobs, theirs.label_logprobs, strict=True)))
        assert ours.greedy_tokens == theirs.greedy_tokens
    # Activations rounded to 2^-16 at every linear of 30 layers: labels moved by 4.9e-5 at most (oneDNN's float32
    # GEMM moves them by a few 1e-5 too), never an answer.
    assert worst <= 2e-4, worst


# The largest label log-probability distance from float32 transformers that bfloat16's rounding gives SmolLM2 on the
# prompts of `_requests`, in any GEMM kernel measured (0.06-0.17 on two CPUs), with a margin.
BFLOAT16_LABEL_ENVELOPE = 0.25


def test_widened_bfloat16_decoder_reads_what_the_bfloat16_gemm_reads(smollm2_dir: Path, smollm2_reference: Any) -> None:
    """`--matmul widen` multiplies the same bfloat16 values in float32 with another order of sums: its labels stay
    inside bfloat16's own distance from float32 transformers, the envelope the packed bfloat16 decoder lands in."""
    widened = load_model(smollm2_dir, LoadOptions(dtype="bfloat16", matmul="widen"))
    native = load_model(smollm2_dir, LoadOptions(dtype="bfloat16", matmul="exact"))
    assert isinstance(widened, DecoderModel) and widened.matmul == "widen" and native.matmul == "exact"
    weight = widened.network.layers[0].mlp.gate_up.weight
    assert isinstance(weight, layers.WideWeight) and weight.dtype == torch.bfloat16
    # Every linear held in float32: 2 bytes more per value than the packed bfloat16 model, and counted so.
    held = [getattr(m, "weight", None) for m in widened.network.modules()]
    values = sum(w.weight.numel() for w in held if isinstance(w, layers.WideWeight))
    assert values > 0 and layers.linear_weight_bytes(widened.network) == 4 * values
    assert widened.weight_bytes() - native.weight_bytes() == 2 * values
    reference = wrap_module(smollm2_reference, widened.path, CPU, torch.float32)
    worst = {"widen": 0.0, "exact": 0.0, "between": 0.0}
    for scored_request in _requests(widened):
        ours, packed = widened.score(scored_request), native.score(scored_request)
        theirs = reference.score(scored_request)
        for name, mine, other in (("widen", ours, theirs), ("exact", packed, theirs), ("between", ours, packed)):
            gaps = (abs(a - b) for a, b in zip(mine.label_logprobs, other.label_logprobs, strict=True))
            worst[name] = max(worst[name], *gaps)
    # bfloat16 rounding over 30 layers moves SmolLM2's labels from float32 by up to about 0.17 in either kernel, and
    # which kernel lands closer depends on the CPU: Intel without AMX widen 0.10 against oneDNN's AVX512-BF16 0.17,
    # Zen 4 widen 0.16 against 0.06 (the two land up to 0.22 apart: "between"). Widening must stay in that envelope;
    # a wrong widened weight moves labels by whole units. (The rounding of each output back to bfloat16 is held bit
    # for bit by test_parallel_layers.py.)
    assert worst["exact"] <= BFLOAT16_LABEL_ENVELOPE, worst
    assert worst["widen"] <= BFLOAT16_LABEL_ENVELOPE and worst["between"] <= 1.5 * BFLOAT16_LABEL_ENVELOPE, worst


def test_matmul_auto_loads_the_mode_this_cpu_runs_fastest(
    smollm2_dir: Path, sliding_qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import decision_server.layers as layers

    timed: list[tuple[int, int, bool]] = []
    for fast_ms, split_ms, expected in ((6.0, 12.0, "fast"), (12.0, 12.0, "exact"), (12.0, 4.0, "split")):

        def probe(
            in_features: int,
            out_features: int,
            bfloat16_weights: bool = True,
            dtype: torch.dtype = torch.float32,
            measured: tuple = (fast_ms, split_ms),
        ) -> layers.MatmulProbe:
            timed.append((in_features, out_features, bfloat16_weights))
            seconds = {"exact": 10e-3, "fast": measured[0] / 1e3, "split": measured[1] / 1e3}
            return layers.MatmulProbe(seconds, (512, in_features, out_features))

        monkeypatch.setattr(layers, "probe_matmul", probe)
        with caplog.at_level("INFO", logger="decision_server.layers"):
            model = load_model(smollm2_dir, LoadOptions(dtype="float32", matmul="auto"))
        assert isinstance(model, DecoderModel) and model.matmul == expected  # Info reports the mode that runs
        weight = model.network.layers[0].mlp.gate_up.weight
        assert isinstance(weight, SplitWeight) == (expected == "split")
        assert (not isinstance(weight, SplitWeight) and weight.is_mkldnn) == (
            expected == "fast" and torch.backends.mkldnn.is_available()
        )
        # The log says what was measured and what it chose.
        (record,) = [r for r in caplog.records if r.getMessage().startswith("matmul auto")]
        assert record.fields["matmul"] == expected and record.fields["fast_ms"] == fast_ms  # type: ignore[attr-defined]
        caplog.clear()
    # Timed at the widest linear, SmolLM2's gate and up projections together, with its weights as stored: bfloat16.
    config = model.text_config
    assert timed == [(config.hidden_size, 2 * config.intermediate_size, True)] * 3
    # transformers' modeling keeps its own linears: nothing is timed, and auto asked for nothing, so nothing is warned.
    with caplog.at_level("WARNING", logger="decision_server"):
        fallback = load_model(sliding_qwen3_dir, LoadOptions(dtype="float32", matmul="auto"))
    assert isinstance(fallback, TransformersModel) and fallback.matmul == "exact"
    assert not any("--matmul" in r.getMessage() for r in caplog.records)
    assert len(timed) == 3
    with pytest.raises(ValueError, match="auto, exact, fast, split"):  # refused before anything loads, on either path
        load_model(sliding_qwen3_dir, LoadOptions(dtype="float32", matmul="fastest"))


def test_a_half_dtype_without_a_fast_gemm_on_this_cpu_is_warned_about(
    tiny_qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import decision_server.layers as layers

    # An AVX2-only CPU (Zen 3) cannot pack bfloat16: its linears convert the weight on every call, about 7x slower
    # than float32. The user who asked for bfloat16 there is told so, and the model still loads.
    warning = "this --dtype has no fast GEMM on this CPU"
    real = layers.bfloat16_packs()
    for packs in (real, False):  # this CPU as it is, then one that cannot pack
        monkeypatch.setattr(layers, "bfloat16_packs", lambda packs=packs: packs)
        with caplog.at_level("WARNING", logger="decision_server"):
            model = load_model(tiny_qwen3_dir, LoadOptions(dtype="bfloat16"))
        assert model.dtype == torch.bfloat16
        warned = [r for r in caplog.records if r.getMessage().startswith(warning)]
        assert len(warned) == (0 if packs else 1)
        if warned:
            assert warned[0].fields["dtype"] == "bfloat16" and warned[0].fields["cpu"]  # type: ignore[attr-defined]
        assert model.network.layers[0].mlp.gate_up.weight.is_mkldnn == packs  # type: ignore[attr-defined]
        caplog.clear()
    # Widened to float32 (`--matmul widen`, which auto picks where it is faster and fits), the linears are fast.
    monkeypatch.setattr(layers, "bfloat16_packs", lambda: False)
    with caplog.at_level("WARNING", logger="decision_server"):
        widened = load_model(tiny_qwen3_dir, LoadOptions(dtype="bfloat16", matmul="widen"))
    assert isinstance(widened.network.layers[0].mlp.gate_up.weight, layers.WideWeight)  # type: ignore[attr-defined]
    assert not any(r.getMessage().startswith(warning) for r in caplog.records)
    # float32 (what auto picks on a CPU) is never warned about, whatever the CPU packs.
    with caplog.at_level("WARNING", logger="decision_server"):
        load_model(tiny_qwen3_dir, LoadOptions(dtype="auto"))
    assert not any(r.getMessage().startswith(warning) for r in caplog.records)


@pytest.mark.parametrize("name", MODELS)
def test_decoder_continues_from_past_keys_like_transformers(request: pytest.FixtureRequest, name: str) -> None:
    model = request.getfixturevalue(name)
    reference = wrap_module(request.getfixturevalue(f"{name}_reference"), model.path, CPU, torch.float32)
    generator = torch.Generator().manual_seed(6)
    head = torch.randint(0, model.token_limit, (20,), generator=generator).tolist()
    first = ScoreRequest(
        token_ids=head, keep=[19], label_rows=[0], label_tokens=[7], greedy_rows=[0], return_key_values=True
    )
    ours_first, theirs_first = model.score(first), reference.score(first)
    assert ours_first.keys is not None and theirs_first.keys is not None
    assert ours_first.values is not None and theirs_first.values is not None
    torch.testing.assert_close(ours_first.keys, theirs_first.keys, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours_first.values, theirs_first.values, rtol=1e-4, atol=1e-4)
    # Two branches continuing the cached 20 tokens: 3 tokens each, both at positions 20..22.
    tail = torch.randint(0, model.token_limit, (6,), generator=generator).tolist()
    allowed = torch.zeros(6, 26, dtype=torch.bool)
    allowed[:, :20] = True
    for branch in (0, 3):
        for query in range(3):
            allowed[branch + query, 20 + branch : 20 + branch + query + 1] = True
    second = ScoreRequest(
        token_ids=tail,
        keep=[2, 5],
        label_rows=[0, 1, 1],
        label_tokens=[1, 2, 3],
        greedy_rows=[0, 1],
        position_ids=[20, 21, 22, 20, 21, 22],
        attention_mask=model.tree_attention_mask(allowed),
        past=(ours_first.keys, ours_first.values),
        return_key_values=True,
    )
    ours, theirs = model.score(second), reference.score(second)
    assert ours.label_logprobs == pytest.approx(theirs.label_logprobs, abs=1e-4)
    assert ours.greedy_tokens == theirs.greedy_tokens
    assert ours.keys is not None and theirs.keys is not None
    torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def sliding_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("sliding-qwen3")
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def test_unimplemented_configs_fall_back_to_transformers_at_world_size_1(
    sliding_qwen3_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = load_model(sliding_qwen3_dir, LoadOptions(dtype="float32"))
    assert isinstance(model, TransformersModel)
    assert (model.rank, model.world_size) == (0, 1)
    # --matmul fast cannot reach transformers' linears: the shard says so and loads the model anyway.
    with caplog.at_level("WARNING", logger="decision_server"):
        fallback = load_model(sliding_qwen3_dir, LoadOptions(dtype="float32", matmul="fast"))
    assert isinstance(fallback, TransformersModel) and fallback.matmul == "exact"
    assert any("--matmul applies to the shard's own decoder only" in r.getMessage() for r in caplog.records)


def test_unimplemented_configs_are_refused_above_world_size_1_before_joining(sliding_qwen3_dir: Path) -> None:
    # Nothing listens on the rendezvous port: a shard that tried to join would wait out the join timeout.
    parallel = ParallelConfig(rank=1, world_size=2, master_port=9, startup_timeout_s=1)
    with pytest.raises(UnsupportedModelError, match=r"sliding-window.*--world-size 1"):
        load_model(sliding_qwen3_dir, LoadOptions(dtype="float32", parallel=parallel))


def test_more_ranks_than_key_value_heads_are_refused(tiny_qwen3_dir: Path) -> None:
    parallel = ParallelConfig(rank=0, world_size=3, master_port=9, startup_timeout_s=1)
    with pytest.raises(UnsupportedModelError, match="2 key/value heads cannot be split over 3 ranks"):
        load_model(tiny_qwen3_dir, LoadOptions(dtype="float32", parallel=parallel))


def test_parallel_flags_are_checked() -> None:
    with pytest.raises(ValueError, match="--master-port is required"):
        ParallelConfig(rank=0, world_size=2)
    with pytest.raises(ValueError, match="--rank must be in"):
        ParallelConfig(rank=2, world_size=2, master_port=1)


def test_weights_report_their_bytes(smollm2: Any) -> None:
    # SmolLM2-135M: 134.5M parameters with the tied head counted once, float32.
    assert smollm2.weight_bytes() == 538_060_032


def _branches_mask(past_tokens: int, branches: list[int], forks: dict[int, int] | None = None) -> torch.Tensor:
    """(tokens, past + tokens) booleans: every token sees the past; branch b is a chain of `branches[b]` tokens
    after it; `forks` {branch: k} makes the branch's last k tokens a second chain hanging off its token -k-1 (a
    multi-token label beside the answer)."""
    tokens = sum(branches)
    allowed = torch.zeros(tokens, past_tokens + tokens, dtype=torch.bool)
    allowed[:, :past_tokens] = True
    start = 0
    for index, length in enumerate(branches):
        fork = (forks or {}).get(index, 0)
        trunk = length - fork
        for query in range(length):
            if query < trunk:
                allowed[start + query, past_tokens + start : past_tokens + start + query + 1] = True
            else:
                # The fork's tokens see the trunk up to its token trunk - 2, then the fork itself.
                allowed[start + query, past_tokens + start : past_tokens + start + trunk - 1] = True
                allowed[start + query, past_tokens + start + trunk : past_tokens + start + query + 1] = True
        start += length
    return allowed


@pytest.mark.parametrize(
    ("heads", "kv_heads", "past_tokens", "branches", "forks"),
    [
        (4, 2, 37, [3, 150, 5, 200], {0: 1, 2: 2}),  # small and large branches, forks in the small ones
        (3, 3, 1, [2, 2], {}),  # two tiny chains grouped into one masked block
        (8, 1, 5, [300], {}),  # one chain: a single causal block
        (2, 1, 64, [40] * 32, {5: 3}),  # 32 questions after a state, in groups of about 128 tokens
    ],
)
def test_tree_attention_after_a_past_equals_the_masked_softmax(
    heads: int, kv_heads: int, past_tokens: int, branches: list[int], forks: dict[int, int]
) -> None:
    from decision_server.decoder import LayerKV, TreeAfterPast, _tree_after_past

    tokens = sum(branches)
    generator = torch.Generator().manual_seed(heads * 100 + tokens)

    def draw(rows: int, length: int) -> torch.Tensor:
        return torch.randn(rows, length, 16, generator=generator, dtype=torch.float64).float()

    query, past = draw(heads, tokens), LayerKV(draw(kv_heads, past_tokens), draw(kv_heads, past_tokens))
    new = LayerKV(draw(kv_heads, tokens), draw(kv_heads, tokens))
    allowed = _branches_mask(past_tokens, branches, forks)
    tree = TreeAfterPast.of(allowed[None, None], past_tokens, torch.float32)
    assert tree is not None
    ours = _tree_after_past(query, new, past, tree, 0.25)
    keys = torch.cat((past.keys, new.keys), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    values = torch.cat((past.values, new.values), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    scores = query.double() @ keys.transpose(1, 2) * 0.25
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ values
    assert ours.dtype == torch.float32 and ours.shape == (heads, tokens, 16)
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=2e-6)


def test_a_tree_after_a_past_is_cut_into_independent_blocks() -> None:
    from decision_server.decoder import MIN_TREE_BLOCK_TOKENS, TreeAfterPast

    def blocks(past: int, branches: list[int], forks: dict[int, int] | None = None) -> list[tuple[int, int, bool]]:
        tree = TreeAfterPast.of(_branches_mask(past, branches, forks)[None, None], past, torch.float32)
        assert tree is not None
        return [(start, end, mask is None) for start, end, mask in tree.blocks]

    big = MIN_TREE_BLOCK_TOKENS
    # Branches of at least MIN_TREE_BLOCK_TOKENS are blocks of their own; a plain chain needs no mask.
    assert blocks(10, [big, big + 5]) == [(0, big, True), (big, 2 * big + 5, True)]
    # A fork (a multi-token label) keeps its branch in one block, with a mask.
    assert blocks(10, [big, big], {1: 2}) == [(0, big, True), (big, 2 * big, False)]
    # Small branches are grouped until a group reaches MIN_TREE_BLOCK_TOKENS; the group needs a mask.
    assert blocks(10, [40] * 8) == [(0, 160, False), (160, 320, False)]
    assert blocks(10, [5]) == [(0, 5, True)]
    # Masked blocks are additive masks in the queries' dtype: 0 where allowed, -inf elsewhere.
    tree = TreeAfterPast.of(_branches_mask(3, [2, 2])[None, None], 3, torch.float32)
    assert tree is not None
    ((start, end, mask),) = tree.blocks
    assert (start, end) == (0, 4) and mask is not None and mask.dtype == torch.float32
    assert torch.equal(mask[0, 0] == 0, _branches_mask(3, [2, 2])[:, 3:])


def _led_mask(past_tokens: int, lead: int, branches: list[int], forks: dict[int, int] | None = None) -> torch.Tensor:
    """(lead + branch tokens, past + lead + branch tokens) booleans: a causal chain of `lead` tokens after the
    past, then `_branches_mask`'s branches, every one of which sees the past and the whole chain."""
    after = _branches_mask(past_tokens + lead, branches, forks)
    tokens = lead + after.shape[0]
    allowed = torch.zeros(tokens, past_tokens + tokens, dtype=torch.bool)
    allowed[:lead, :past_tokens] = True
    allowed[:lead, past_tokens : past_tokens + lead] = torch.ones(lead, lead, dtype=torch.bool).tril()
    allowed[lead:] = after
    return allowed


@pytest.mark.parametrize(
    ("heads", "kv_heads", "past_tokens", "lead", "branches", "forks"),
    [
        (4, 2, 0, 90, [3, 150, 5, 40], {0: 1, 2: 2}),  # a state without a past, its questions in the same pass
        (4, 2, 23, 64, [40] * 6, {3: 2}),  # the same after a cached prefix
        (2, 2, 100, 40, [7, 9], {}),  # a cached prefix longer than the chain (the chain after it attended apart)
        (3, 1, 0, 50, [], {}),  # only the chain: the whole pass is the lead
    ],
)
def test_tree_attention_led_by_a_chain_equals_the_masked_softmax(
    heads: int, kv_heads: int, past_tokens: int, lead: int, branches: list[int], forks: dict[int, int]
) -> None:
    """One pass over a state and its questions (`TreeAfterPast.lead`) attends exactly what the dense mask allows."""
    from decision_server.decoder import LayerKV, TreeAfterPast, _tree_after_past

    tokens = lead + sum(branches)
    generator = torch.Generator().manual_seed(heads * 100 + tokens + past_tokens)

    def draw(rows: int, length: int) -> torch.Tensor:
        return torch.randn(rows, length, 16, generator=generator, dtype=torch.float64).float()

    query = draw(heads, tokens)
    past = LayerKV(draw(kv_heads, past_tokens), draw(kv_heads, past_tokens)) if past_tokens else None
    new = LayerKV(draw(kv_heads, tokens), draw(kv_heads, tokens))
    allowed = _led_mask(past_tokens, lead, branches, forks)
    tree = TreeAfterPast.of(allowed[None, None], past_tokens, torch.float32)
    assert tree is not None and tree.lead == lead
    ours = _tree_after_past(query, new, past, tree, 0.25)
    old_keys = past.keys if past is not None else new.keys[:, :0]
    old_values = past.values if past is not None else new.values[:, :0]
    keys = torch.cat((old_keys, new.keys), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    values = torch.cat((old_values, new.values), dim=1).double().repeat_interleave(heads // kv_heads, dim=0)
    scores = query.double() @ keys.transpose(1, 2) * 0.25
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ values
    assert ours.dtype == torch.float32 and ours.shape == (heads, tokens, 16)
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=2e-6)


def test_a_lead_is_the_chain_every_later_token_sees_whole() -> None:
    from decision_server.decoder import MIN_LEAD_TOKENS, TreeAfterPast

    def split(allowed: torch.Tensor, past: int) -> tuple[int, list[tuple[int, int]]] | None:
        tree = TreeAfterPast.of(allowed[None, None], past, torch.float32)
        return None if tree is None else (tree.lead, [(start, end) for start, end, _ in tree.blocks])

    # A state and its questions: the state leads, the questions are blocks after it.
    assert split(_led_mask(0, 100, [40] * 4), 0) == (100, [(0, 160)])
    assert split(_led_mask(12, 100, [200, 5]), 12) == (100, [(0, 200), (200, 205)])
    assert split(_led_mask(12, 100, [200]), 12) == (300, [])  # one chain after all: the whole pass leads
    # A chain shorter than MIN_LEAD_TOKENS rides the first block (after a past), or the pass stays dense (none).
    short = MIN_LEAD_TOKENS - 1
    assert split(_led_mask(12, short, [40] * 4), 12) == (0, [(0, short + 160)])
    assert split(_led_mask(0, short, [40] * 4), 0) is None
    # A branch that does not see the whole chain cuts the lead to the part every branch sees.
    allowed = _led_mask(0, 100, [40] * 4)
    allowed[150, 60:100] = False
    assert split(allowed, 0) == (60, [(0, 200)])
    # Independent chains (two requests' states) have no lead: no token sees the first chain whole.
    assert split(_branches_mask(0, [100, 100]), 0) is None


def test_a_mask_that_hides_part_of_the_past_is_not_split() -> None:
    from decision_server.decoder import TreeAfterPast

    allowed = _branches_mask(6, [3, 3])
    assert TreeAfterPast.of(allowed[None, None], 0, torch.float32) is None  # no past, no lead
    allowed[4, 2] = False  # one token does not see past token 2 (another request's cached prefix)
    assert TreeAfterPast.of(allowed[None, None], 6, torch.float32) is None
    additive = torch.zeros(1, 1, 6, 12)  # eager attention's additive mask: left as it is
    assert TreeAfterPast.of(additive, 6, torch.float32) is None


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("shape", ["causal", "tree", "causal after past", "tree after past"])
def test_the_last_layer_computes_only_the_kept_rows(request: pytest.FixtureRequest, name: str, shape: str) -> None:
    """With `keep`, the hidden states are the kept rows of the full pass's, every layer's keys/values are the
    full pass's, and the last layer's MLP sees only the kept rows (none at all for an empty `keep`)."""
    model = request.getfixturevalue(name)
    network = model.network
    generator = torch.Generator().manual_seed(7)
    past_length = 0 if "past" not in shape else 23
    tokens = 40
    ids = torch.randint(0, model.token_limit, (past_length + tokens,), generator=generator)
    past = None
    if past_length:
        with torch.inference_mode():
            _, past = network.hidden_states(ids[:past_length], torch.arange(past_length), None, None)
    mask = None
    positions = torch.arange(past_length, past_length + tokens)
    if "tree" in shape:
        # Four branches of 10 tokens after the past (or after the branches' common first token).
        allowed = _branches_mask(past_length, [10, 10, 10, 10], {1: 2})
        if not past_length:
            allowed[:, 0] = True
        mask = model.tree_attention_mask(allowed)
        positions = torch.tensor([past_length + i % 10 for i in range(tokens)])
    seen: list[int] = []
    hook = network.layers[-1].mlp.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    try:
        with torch.inference_mode():
            full, full_kv = network.hidden_states(ids[past_length:], positions, mask, past)
            for keep in ([39, 3, 19, 20], []):
                seen.clear()
                kept, kept_kv = network.hidden_states(ids[past_length:], positions, mask, past, keep)
                assert seen == ([len(keep)] if keep else [])
                assert kept.shape == (len(keep), network.shape.hidden_size)
                torch.testing.assert_close(kept, full[keep], rtol=0, atol=2e-5)
                for ours, theirs in zip(kept_kv, full_kv, strict=True):
                    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    finally:
        hook.remove()


@pytest.mark.parametrize("dtype, matmul", [("float32", "fast"), ("bfloat16", "auto")])
@pytest.mark.parametrize("shape", ["causal", "tree", "causal after past"])
def test_bucketed_passes_run_their_gemms_at_bucketed_row_counts(
    tiny_qwen3_dir: Path, dtype: str, matmul: str, shape: str
) -> None:
    """With `bucket_rows` (AMX: oneDNN builds a kernel per row count) every projection runs `gemm_rows` rows, and
    the padding changes nothing else: hidden states as without it, keys/values of the pass's tokens only. The padding
    needs no AMX, so it is checked on every CPU."""
    model = load_model(tiny_qwen3_dir, LoadOptions(dtype=dtype, matmul=matmul))
    assert isinstance(model, DecoderModel)
    network = model.network
    rule = network.bucket_rows
    assert layers.ROW_BUCKET == 16
    generator = torch.Generator().manual_seed(11)
    past_length, tokens = (23 if "past" in shape else 0), 40
    ids = torch.randint(0, model.token_limit, (past_length + tokens,), generator=generator)
    positions = torch.arange(past_length, past_length + tokens)
    past = mask = None
    if past_length:
        with torch.inference_mode():
            _, past = network.hidden_states(ids[:past_length], torch.arange(past_length), None, None)
    if shape == "tree":
        allowed = _branches_mask(0, [10, 10, 10, 10], {1: 2})
        allowed[:, 0] = True
        mask = model.tree_attention_mask(allowed)
        positions = torch.tensor([i % 10 for i in range(tokens)])
    keep = list(range(0, tokens, 2))  # 20 kept rows: 32 in the last layer
    linears = [m for m in network.modules() if isinstance(m, layers.ColumnParallelLinear | layers.RowParallelLinear)]
    rows_seen: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, args, _o: rows_seen.append(args[0].shape[0])) for m in linears]
    try:
        with torch.inference_mode():
            results = {}
            for bucket in (True, False):
                network.bucket_rows = bucket
                rows_seen.clear()
                results[bucket] = (
                    network.hidden_states(ids[past_length:], positions, mask, past),
                    network.hidden_states(ids[past_length:], positions, mask, past, keep),
                )
                per_layer = 4 * len(network.layers)
                assert rows_seen[:per_layer] == [48 if bucket else 40] * per_layer
                # The kept pass: full rows up to the last layer, whose output projection and MLP see the kept rows.
                last = rows_seen[per_layer + per_layer - 3 :]
                assert last == [32 if bucket else 20] * 3
    finally:
        network.bucket_rows = rule
        for hook in hooks:
            hook.remove()
    tolerance = {"float32": 1e-5, "bfloat16": 2e-2}[dtype]
    for (bucketed, bucketed_kv), (plain, plain_kv) in zip(results[True], results[False], strict=True):
        assert bucketed.shape == plain.shape
        torch.testing.assert_close(bucketed.float(), plain.float(), rtol=0, atol=tolerance)
        for ours, theirs in zip(bucketed_kv, plain_kv, strict=True):
            assert ours.keys.shape == theirs.keys.shape == (network.shape.kv_heads, tokens, network.shape.head_dim)
            torch.testing.assert_close(ours.keys.float(), theirs.keys.float(), rtol=0, atol=tolerance)
            torch.testing.assert_close(ours.values.float(), theirs.values.float(), rtol=0, atol=tolerance)


@pytest.mark.parametrize("amx", [True, False])
@pytest.mark.parametrize(
    "dtype, matmul", [("float32", "fast"), ("float32", "exact"), ("bfloat16", "exact"), ("bfloat16", "widen")]
)
def test_only_passes_over_amx_half_precision_gemms_are_bucketed(
    tiny_qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, amx: bool, dtype: str, matmul: str
) -> None:
    """Row buckets pay where oneDNN builds AMX kernels per row count (bfloat16 packed weights on an AMX CPU), not
    where its AVX-512 kernels cost less than the padding (Zen 4), nor for float32 weights (AMX does not multiply
    them, nor for half-precision weights widened to float32)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    model = load_model(tiny_qwen3_dir, LoadOptions(dtype=dtype, matmul=matmul))
    assert isinstance(model, DecoderModel)
    assert model.network.bucket_rows == (amx and matmul == "exact" and dtype == "bfloat16" and layers.bfloat16_packs())


def test_gemm_rows_rounds_up_to_the_bucket_above_it() -> None:
    assert [layers.gemm_rows(n) for n in (1, 15, 16, 17, 32, 33, 860, 861)] == [1, 15, 16, 32, 32, 48, 864, 864]
