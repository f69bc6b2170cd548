"""Segment attention in one FlexAttention call (`flex_segments`): its block lists never skip an allowed pair nor
take a tile whole that is not, and the compiled kernel equals SDPA over the layout's dense mask, on the same layouts
the tree engine builds (causal states after cached prefixes, question trees seeing their state whole)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import use_segment_kernel

from decision_server import decoder_model
from decision_server.flex_segments import BLOCK, FlexSegments
from decision_server.segments import NEW, PAST, AttentionSegment, KeyRange, SegmentLayout


def random_tree(generator: np.random.Generator, size: int) -> np.ndarray:
    """A trie laid out as the tree engine lays it: every token after its parent; row i sees its ancestors."""
    parent = [-1] + [int(generator.integers(-1, i)) for i in range(1, size)]
    allowed = np.zeros((size, size), dtype=bool)
    for token in range(size):
        at = token
        while at >= 0:
            allowed[token, at] = True
            at = parent[at]
    return allowed


def requests_layout(seed: int, requests: int, past_length: int) -> SegmentLayout:
    """Per request a causal state (some after cached keys of the past) and a question tree that sees it whole."""
    generator = np.random.default_rng(seed)
    segments: list[AttentionSegment] = []
    at = 0
    for request in range(requests):
        state = int(generator.integers(40, 300))
        cached: tuple[KeyRange, ...] = ()
        if past_length and request % 2:
            start = int(generator.integers(0, past_length // 2))
            cached = (KeyRange(PAST, start, int(generator.integers(start + 1, past_length + 1))),)
        segments.append(AttentionSegment(at, at + state, cached))
        questions = int(generator.integers(5, 180))
        segments.append(
            AttentionSegment(
                at + state,
                at + state + questions,
                (*cached, KeyRange(NEW, at, at + state)),
                random_tree(generator, questions),
            )
        )
        at += state + questions
    return SegmentLayout(tuple(segments))


def tile_truth(allowed: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (query block, key block): whether any pair is allowed, and whether every pair is."""
    rows, keys = allowed.shape
    any_ = np.zeros((-(-rows // block), -(-keys // block)), dtype=bool)
    all_ = np.zeros_like(any_)
    for q in range(any_.shape[0]):
        for k in range(any_.shape[1]):
            tile = allowed[q * block : (q + 1) * block, k * block : (k + 1) * block]
            any_[q, k], all_[q, k] = tile.any(), tile.all()
    return any_, all_


def block_sets(mask: FlexSegments) -> tuple[np.ndarray, np.ndarray]:
    block_mask = mask.block_mask
    shape = (block_mask.kv_num_blocks.shape[-1], -(-block_mask.seq_lengths[1] // BLOCK))
    partial, full = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    for target, counts, indices in (
        (partial, block_mask.kv_num_blocks, block_mask.kv_indices),
        (full, block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        for q in range(shape[0]):
            target[q, indices[0, 0, q, : counts[0, 0, q]].numpy()] = True
    return partial, full


@pytest.mark.parametrize(("seed", "requests", "past_length"), [(0, 1, 0), (1, 5, 0), (2, 7, 300), (3, 3, 128)])
def test_block_lists_cover_every_allowed_pair_and_only_whole_tiles_are_full(
    seed: int, requests: int, past_length: int
) -> None:
    layout = requests_layout(seed, requests, past_length)
    allowed = layout.dense_allowed(past_length)
    mask = FlexSegments.of(layout, past_length, torch.device("cpu"))
    partial, full = block_sets(mask)
    any_, all_ = tile_truth(allowed, BLOCK)
    assert not (partial & full).any()
    assert ((partial | full) == any_).all(), "a tile with an allowed pair is skipped, or an empty tile is computed"
    assert (full <= all_).all(), "a tile is taken whole although some pair in it is not allowed"
    # Between requests nothing is computed: the tiles read are a small part of the whole square.
    if requests >= 5:
        assert (partial | full).sum() < 0.5 * partial.size
    # Kept rows (the last layer's): the same rule for a subset of rows, in any order.
    rows = sorted(np.random.default_rng(seed).choice(layout.tokens, size=min(150, layout.tokens), replace=False))
    kept = FlexSegments.of(layout, past_length, torch.device("cpu"), rows=[int(row) for row in rows])
    partial, full = block_sets(kept)
    any_, all_ = tile_truth(allowed[rows], BLOCK)
    assert ((partial | full) == any_).all() and (full <= all_).all() and not (partial & full).any()


def test_a_tree_that_sees_a_later_token_is_refused() -> None:
    tree = np.tri(4, dtype=bool)
    tree[1, 3] = True
    layout = SegmentLayout((AttentionSegment(0, 4, (), tree),))
    with pytest.raises(ValueError, match="sees a later token"):
        FlexSegments.of(layout, 0, torch.device("cpu"))


def test_one_compiled_call_equals_sdpa_over_the_dense_layout() -> None:
    # One layout, compiled (on CPU a compile per shape costs tens of seconds: the other tests read the same block
    # mask eagerly): cached keys before the pass, question trees, a stream that is no multiple of the tile.
    seed, past_length = 5, 200
    layout = requests_layout(seed, 6, past_length)
    heads, kv_heads, head_dim, tokens = 4, 2, 32, layout.tokens
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(heads, tokens, head_dim, generator=generator)
    keys = torch.randn(kv_heads, past_length + tokens, head_dim, generator=generator)
    values = torch.randn(kv_heads, past_length + tokens, head_dim, generator=generator)
    allowed = torch.from_numpy(layout.dense_allowed(past_length))
    expected = torch.nn.functional.scaled_dot_product_attention(
        query[None], keys[None], values[None], attn_mask=allowed[None, None], enable_gqa=True
    )[0]

    class Past:
        def __init__(self) -> None:
            self.keys, self.values = keys[:, :past_length], values[:, :past_length]

    mask = FlexSegments.of(layout, past_length, torch.device("cpu"))
    got = mask.attend(query, keys[:, past_length:], values[:, past_length:], Past())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    rows = list(range(3, tokens, 7))
    kept = FlexSegments.of(layout, past_length, torch.device("cpu"), rows=rows)
    got_rows = kept.attend(query[:, rows], keys[:, past_length:], values[:, past_length:], Past())
    torch.testing.assert_close(got_rows, expected[:, rows], atol=2e-5, rtol=1e-5)


def test_the_load_probe_compares_flex_with_sdpa_on_the_models_heads(
    tiny_qwen3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_segment_kernel(monkeypatch, tiny_qwen3, "flex")
    assert decoder_model._flex_probe(tiny_qwen3.network, torch.float32, torch.device("cpu")) < 1e-5


@pytest.mark.parametrize(
    ("probe", "chosen"),
    [(lambda *_: 0.0, "flex"), (lambda *_: 0.5, "sdpa"), (lambda *_: float("nan"), "sdpa"), ("raise", "sdpa")],
    ids=["equal", "differs", "nan", "fails-to-build"],
)
def test_off_cpu_the_shard_takes_flex_only_where_its_probe_passes(
    tiny_qwen3: Any, monkeypatch: pytest.MonkeyPatch, probe: Any, chosen: str
) -> None:
    def broken(*_: Any) -> float:
        raise RuntimeError("inductor cannot build the kernel here")

    monkeypatch.setattr(decoder_model, "_flex_probe", broken if probe == "raise" else probe)
    monkeypatch.setattr(tiny_qwen3, "segment_kernel", "split")
    assert tiny_qwen3.choose_segment_kernel() == "split"  # on CPU the split kernels, whatever the probe says
    monkeypatch.setattr(tiny_qwen3, "device", torch.device("cuda"))
    assert tiny_qwen3.choose_segment_kernel() == chosen
    assert tiny_qwen3.segment_attention == chosen


@pytest.mark.parametrize("rows", [None, [0], [57]], ids=["all-rows", "first-row", "one-kept-row"])
def test_one_segment_and_one_row_are_padded_to_the_tables_every_pass_shares(
    monkeypatch: pytest.MonkeyPatch, rows: list[int] | None
) -> None:
    # Dynamic shapes specialise sizes 0 and 1: a pass of one segment or one kept row must still take the tables of
    # the kernel compiled at load (2+ segments, 2+ rows, MIN_RANGES columns), and answer for its own rows only.
    from torch.nn.attention.flex_attention import flex_attention

    from decision_server import flex_segments

    monkeypatch.setattr(flex_segments, "kernel", lambda device_type: flex_attention)
    layout = SegmentLayout((AttentionSegment(0, 60, (KeyRange(PAST, 5, 30),)),))
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(4, 60, 16, generator=generator)
    keys, values = torch.randn(2, 100, 16, generator=generator), torch.randn(2, 100, 16, generator=generator)
    allowed = torch.from_numpy(layout.dense_allowed(40))
    expected = torch.nn.functional.scaled_dot_product_attention(
        query[None], keys[None], values[None], attn_mask=allowed[None, None], enable_gqa=True
    )[0]

    past = SimpleNamespace(keys=keys[:, :40], values=values[:, :40])
    mask = FlexSegments.of(layout, 40, torch.device("cpu"), rows=rows)
    mod = mask.block_mask.mask_mod
    tables = {name: cell.cell_contents for name, cell in zip(mod.__code__.co_freevars, mod.__closure__, strict=True)}
    assert tables["start"].shape[0] >= 2 and tables["query_token"].shape[0] >= 2 and tables["tree"].shape[0] >= 2
    assert tables["range_low"].shape[1] >= flex_segments.MIN_RANGES
    chosen = list(range(60)) if rows is None else rows
    got = mask.attend(query[:, chosen], keys[:, 40:], values[:, 40:], past)
    assert got.shape == (4, len(chosen), 16)
    torch.testing.assert_close(got, expected[:, chosen], atol=2e-5, rtol=1e-5)


def test_with_dynamic_shapes_a_new_batch_reuses_the_compiled_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off CPU the kernel is compiled once with dynamic shapes (`compile_options`): a pass of any other size must
    reuse it, or every batch would compile again (seconds on a GPU) and, past dynamo's recompile limit, fall back to
    eager FlexAttention, which materialises every score. The guards are dynamo's, whatever the backend, so the
    eager backend checks them on CPU: after the forms a served pass takes (with and without cached keys, every row or
    kept rows) have compiled once, eight batches of other sizes compile nothing more."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    from decision_server import flex_segments

    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, backend="eager", **flex_segments.compile_options("cuda"))
    monkeypatch.setattr(flex_segments, "kernel", lambda device_type: compiled)
    counters = torch._dynamo.utils.counters
    before = counters["stats"]["unique_graphs"]  # other tests' compiles

    def serve(seed: int, requests: int, past_length: int) -> None:
        layout = requests_layout(seed, requests, past_length)
        tokens = layout.tokens
        generator = torch.Generator().manual_seed(seed)
        query = torch.randn(4, tokens, 16, generator=generator)
        keys = torch.randn(2, past_length + tokens, 16, generator=generator)
        values = torch.randn(2, past_length + tokens, 16, generator=generator)
        past = SimpleNamespace(keys=keys[:, :past_length], values=values[:, :past_length]) if past_length else None
        for rows in (None, sorted({0, 5, tokens // 2, tokens - 1})):
            mask = FlexSegments.of(layout, past_length, torch.device("cpu"), rows=rows)
            chosen = list(range(tokens)) if rows is None else rows
            got = mask.attend(query[:, chosen], keys[:, past_length:], values[:, past_length:], past)
            assert got.shape == (4, len(chosen), 16)

    serve(1, 5, 0)
    serve(2, 7, 300)
    forms = counters["stats"]["unique_graphs"] - before
    assert 0 < forms <= 4
    for seed, (requests, past_length) in enumerate(
        [(3, 128), (9, 0), (11, 50), (4, 0), (2, 400), (6, 0), (8, 77), (1, 0)]
    ):
        serve(10 + seed, requests, past_length)
    assert counters["stats"]["unique_graphs"] - before == forms
    torch._dynamo.reset()
