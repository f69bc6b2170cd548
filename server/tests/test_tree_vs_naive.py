"""Tree reads (one packed forward per batch) equal naive per-read prefills, and count shared tokens once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import greedy_token, label_logprobs, read_request, use_segment_kernel
from prompts import QUESTIONS, STATES, label_tokens, prompt_tokens

from decision_server.engines import NaiveEngine, ReadSpec, TreeEngine
from decision_server.model import LoadedModel, wrap_module
from decision_server.prefix_cache import PrefixCache

MODELS = ("smollm2", "tiny_qwen3")


def decision_batch(model_dir: Path) -> list[ReadSpec]:
    """Two "requests" (different states) with several questions each, plus a short unrelated read.

    Reads of one request share the chat head and the state; labels mix single tokens and multi-token
    sequences, some sharing first tokens, so the packed tree has prompt branches and label branches.
    """
    single = [label_tokens(model_dir, text)[:1] for text in ("A", "B", "yes", "no")]
    multi = [label_tokens(model_dir, "refund - money back"), label_tokens(model_dir, "refund please")]
    reads = []
    read_id = 100
    for state in STATES:
        for question in QUESTIONS:
            reads.append(ReadSpec(id=read_id, prompt=tuple(prompt_tokens(model_dir, state, question)), labels=()))
            read_id += 1
    labelled = []
    for index, read in enumerate(reads):
        labels = single if index % 2 == 0 else single[:2] + multi
        labelled.append(ReadSpec(id=read.id, prompt=read.prompt, labels=tuple(tuple(label) for label in labels)))
    short = tuple(label_tokens(model_dir, "Is the sky blue?"))
    labelled.append(ReadSpec(id=7, prompt=short, labels=(tuple(multi[0]), tuple(single[0]))))
    return labelled


def expected_tokens_computed(reads: list[ReadSpec]) -> list[int]:
    """Prompt tokens not already computed for an earlier read of the batch with the same salt."""
    seen: set[tuple[str, tuple[int, ...]]] = set()
    counts = []
    for read in reads:
        fresh = 0
        for end in range(1, len(read.prompt) + 1):
            key = (read.cache_salt, read.prompt[:end])
            if key not in seen:
                seen.add(key)
                fresh += 1
        counts.append(fresh)
    return counts


def assert_same_reads(tree: Any, naive: Any, tolerance: float = 1e-4) -> None:
    assert [o.id for o in tree.outcomes] == [o.id for o in naive.outcomes]
    for a, b in zip(tree.outcomes, naive.outcomes, strict=True):
        assert len(a.label_logprobs) == len(b.label_logprobs)
        assert a.label_logprobs == pytest.approx(b.label_logprobs, abs=tolerance)
        assert a.greedy_token_id == b.greedy_token_id


# (min_chain_tokens, min_split_tokens): everything in one masked pass; the defaults; chains and splits everywhere;
# each state a chain, its questions and labels one masked pass after it (what the defaults make of long states).
PLANS = {"one-pass": (10**9, 10**9), "default": (32, 256), "split": (4, 16), "branches": (8, 64)}


# How the decoder runs a batch: one packed pass with its CPU kernels per segment; the same pass with one SDPA call per
# segment, or with one FlexAttention call per layer (what runs off CPU); or, as a model without segments
# (transformers' modeling), planned passes in turn.
KERNELS = ("packed", "packed-sdpa", "packed-flex", "passes")


def with_kernel(monkeypatch: pytest.MonkeyPatch, model: LoadedModel, kernel: str) -> None:
    if kernel in ("packed-sdpa", "packed-flex"):
        use_segment_kernel(monkeypatch, model, kernel.removeprefix("packed-"))
    if kernel == "passes":
        monkeypatch.setattr(model, "packs_segments", lambda: False)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("name", MODELS)
def test_tree_equals_naive_on_a_mixed_batch(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    naive_outcomes: Any,
    name: str,
    plan: str,
    kernel: str,
) -> None:
    from decision_server import decoder

    model = request.getfixturevalue(name)
    with_kernel(monkeypatch, model, kernel)
    reads = decision_batch(model.path)
    min_chain, min_split = PLANS[plan]
    # Branch passes after a computed chain attend it without a mask and themselves block by block.
    split_passes = []
    attend = decoder._tree_after_past
    monkeypatch.setattr(decoder, "_tree_after_past", lambda *args: split_passes.append(args[3]) or attend(*args))
    tree = TreeEngine(model, min_chain_tokens=min_chain, min_split_tokens=min_split).run(reads)
    # (Chain continuations go through the same attention as one causal block, without a tree mask.)
    tree_passes = [split for split in split_passes if any(mask is not None for _, _, mask in split.blocks)]
    if kernel == "packed-sdpa":
        assert not split_passes
    elif kernel == "passes":
        assert bool(tree_passes) == (plan == "branches")
    naive = naive_outcomes(model, reads)
    assert_same_reads(tree, naive)
    assert naive.forward_passes == len(reads) + sum(1 for r in reads for label in r.labels if len(label) > 1)
    if kernel != "passes" or plan == "one-pass":
        # Both requests, their questions and the unrelated read: one walk over the layers.
        assert tree.forward_passes == 1
    elif plan == "split":
        # A causal pass per shared chain, a masked pass per set of branches: several, far fewer than naive's.
        assert 3 <= tree.forward_passes < naive.forward_passes
    assert tree.packed_tokens == TreeEngine(model).run(reads).packed_tokens


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("plan", ["default", "split"])
def test_planned_passes_with_a_prefix_cache_equal_naive(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch, naive_outcomes: Any, plan: str, kernel: str
) -> None:
    from decision_server.prefix_cache import PrefixCache

    with_kernel(monkeypatch, tiny_qwen3, kernel)
    min_chain, min_split = PLANS[plan]
    tree = TreeEngine(
        tiny_qwen3, prefix_cache=PrefixCache(64 << 20), min_chain_tokens=min_chain, min_split_tokens=min_split
    )
    reads = decision_batch(tiny_qwen3.path)
    first = tree.run(reads[: len(reads) // 2])
    # The second half continues from what the first half cached (chat head, first state) and adds a new state.
    second = tree.run(reads)
    assert sum(o.tokens_cached for o in second.outcomes) > 0
    if kernel != "passes":
        # Cached prefixes of two roots and a new state, all in one pass.
        assert first.forward_passes == second.forward_passes == 1
    assert_same_reads(first, naive_outcomes(tiny_qwen3, reads[: len(reads) // 2]), tolerance=1e-5)
    assert_same_reads(second, naive_outcomes(tiny_qwen3, reads), tolerance=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_tree_counts_shared_prompt_tokens_once(request: pytest.FixtureRequest, naive_outcomes: Any, name: str) -> None:
    model = request.getfixturevalue(name)
    reads = decision_batch(model.path)
    tree = TreeEngine(model).run(reads)
    counts = [o.tokens_computed for o in tree.outcomes]
    assert counts == expected_tokens_computed(reads)
    unique = len({read.prompt[:end] for read in reads for end in range(1, len(read.prompt) + 1)})
    assert sum(counts) == unique
    # The questions of one request share the chat head and the state: a later read computes only its own tail.
    shared = next(i for i, (a, b) in enumerate(zip(reads[0].prompt, reads[1].prompt, strict=False)) if a != b)
    assert shared > 10
    assert counts[1] == len(reads[1].prompt) - shared
    naive = naive_outcomes(model, reads)
    multi = [sum(1 for label in read.labels if len(label) > 1) for read in reads]
    assert [o.tokens_computed for o in naive.outcomes] == [
        len(r.prompt) * (1 + m) for r, m in zip(reads, multi, strict=True)
    ]


def test_tree_and_naive_servers_agree_over_grpc(tiny_qwen3: LoadedModel, shard: Any) -> None:
    reads = decision_batch(tiny_qwen3.path)
    request = read_request([(r.id, list(r.prompt), [list(label) for label in r.labels]) for r in reads])
    with shard(tiny_qwen3, "tree") as stub:
        tree = stub.Read(request)
    with shard(tiny_qwen3, "naive") as stub:
        naive = stub.Read(request)
    assert [r.id for r in tree.results] == [r.id for r in reads]
    for a, b in zip(tree.results, naive.results, strict=True):
        assert label_logprobs(a) == pytest.approx(label_logprobs(b), abs=1e-4)
        assert greedy_token(a) == greedy_token(b)
    assert sum(r.tokens_computed for r in tree.results) < sum(r.tokens_computed for r in naive.results)


def test_different_salts_share_nothing(tiny_qwen3: LoadedModel) -> None:
    prompt = tuple(prompt_tokens(tiny_qwen3.path, STATES[0], QUESTIONS[1]))
    labels = ((9693,), (2152,))
    reads = [
        ReadSpec(id=1, prompt=prompt, labels=labels, cache_salt="tenant-a"),
        ReadSpec(id=2, prompt=prompt, labels=labels, cache_salt="tenant-b"),
        ReadSpec(id=3, prompt=prompt, labels=labels, cache_salt="tenant-a"),
    ]
    tree = TreeEngine(tiny_qwen3).run(reads)
    assert [o.tokens_computed for o in tree.outcomes] == [len(prompt), len(prompt), 0]
    assert tree.outcomes[0].label_logprobs == pytest.approx(tree.outcomes[1].label_logprobs, abs=1e-5)
    assert_same_reads(tree, NaiveEngine(tiny_qwen3).run(reads))


def test_prompt_that_extends_another_reads_label_branch(tiny_qwen3: LoadedModel) -> None:
    # Read 2's prompt runs through read 1's label branch node: the node is computed once, and counted for
    # read 2 because it is a prompt token there (read 1's branch is scoring work, not prompt).
    base = tuple(prompt_tokens(tiny_qwen3.path, STATES[1], QUESTIONS[0]))
    reads = [
        ReadSpec(id=1, prompt=base, labels=((32, 33, 34),)),
        ReadSpec(id=2, prompt=(*base, 32), labels=((33, 34), (35,))),
    ]
    tree = TreeEngine(tiny_qwen3).run(reads)
    assert [o.tokens_computed for o in tree.outcomes] == [len(base), 1]
    assert_same_reads(tree, NaiveEngine(tiny_qwen3).run(reads), tolerance=1e-5)
    # The same sequence scored two ways: P(32 33 34 | base) = P(32 | base) * P(33 34 | base 32).
    both = NaiveEngine(tiny_qwen3).run([ReadSpec(id=3, prompt=base, labels=((32,),))]).outcomes[0].label_logprobs[0]
    assert tree.outcomes[0].label_logprobs[0] == pytest.approx(both + tree.outcomes[1].label_logprobs[0], abs=1e-5)


@pytest.mark.parametrize(("max_tokens", "max_rows"), [(60, 512), (4096, 3)])
def test_split_batches_equal_one_pass(tiny_qwen3: LoadedModel, max_tokens: int, max_rows: int) -> None:
    reads = decision_batch(tiny_qwen3.path)
    whole = TreeEngine(tiny_qwen3).run(reads)
    split = TreeEngine(tiny_qwen3, max_packed_tokens=max_tokens, max_logit_rows=max_rows).run(reads)
    assert split.forward_passes > 1
    assert_same_reads(split, whole, tolerance=1e-5)
    # A prefix recomputed in another pass is counted again: honest about work done.
    assert sum(o.tokens_computed for o in split.outcomes) >= sum(o.tokens_computed for o in whole.outcomes)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sliding_window_layers_get_a_windowed_tree_mask(tmp_path: Path, attn: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # Layer 0 full attention, layers 1-2 sliding with a window shorter than the prompts: a tree mask that
    # ignored the window would let sliding layers see too far back and differ from the naive prefill.
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=1,
        attn_implementation=attn,  # type: ignore[call-arg]  # a PreTrainedConfig keyword, not in the stub
    )
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    torch.manual_seed(0)
    model = wrap_module(Qwen3ForCausalLM(config), tmp_path, torch.device("cpu"), torch.float32)
    assert model.attn_implementation == attn
    generator = torch.Generator().manual_seed(3)
    head = torch.randint(0, 512, (12,), generator=generator).tolist()
    reads = [
        ReadSpec(
            id=i,
            prompt=tuple(head + torch.randint(0, 512, (3 + i,), generator=generator).tolist()),
            labels=((1,), (2, 3, 4, 5, 6, 7), (2, 3, 9)),
        )
        for i in range(3)
    ]
    tree = TreeEngine(model).run(reads)
    naive = NaiveEngine(model).run(reads)
    assert_same_reads(tree, naive, tolerance=1e-5)
    # Guard that the window matters here: with it disabled the tree result must change.
    model.module.config.sliding_window = None
    model.module.config.layer_types = ["full_attention"] * 3
    unwindowed = TreeEngine(model).run(reads)
    assert (
        max(
            abs(a - b)
            for x, y in zip(unwindowed.outcomes, naive.outcomes, strict=True)
            for a, b in zip(x.label_logprobs, y.label_logprobs, strict=True)
        )
        > 1e-3
    )


def test_each_new_state_gets_a_chunk_of_its_own_with_a_prefix_cache_where_passes_run_in_turn(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two requests with long states (after a shared head) and three questions each, then a short unrelated read.
    # For a model that runs planned passes in turn (no segments), the states share no pass, and with a prefix cache
    # every pass keeps its keys/values until the chunk ends: one chunk holding both was 1.1x slower per token
    # (measured). Each new state starts a chunk, its questions stay with it, the short read packs with whatever is
    # open, and the second chunk continues the head from the cache. A model that packs segments runs them all in one.
    packed = TreeEngine(tiny_qwen3, min_split_tokens=64, prefix_cache=PrefixCache(64 << 20))
    monkeypatch.setattr(tiny_qwen3, "packs_segments", lambda: False)
    generator = torch.Generator().manual_seed(3)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(5, 200, (count,), generator=generator).tolist())

    head = tokens(10)
    reads = []
    for state in (head + tokens(80), head + tokens(80)):
        for question in range(3):
            reads.append(ReadSpec(id=len(reads), prompt=state + tokens(4 + question), labels=((7,), (8, 9))))
    reads.append(ReadSpec(id=len(reads), prompt=tokens(12), labels=((7,),)))
    engine = TreeEngine(tiny_qwen3, min_split_tokens=64, prefix_cache=PrefixCache(64 << 20))
    assert [[read.id for read in chunk] for chunk in engine._chunks(reads)] == [[0, 1, 2], [3, 4, 5, 6]]
    split = engine.run(reads)
    assert_same_reads(split, NaiveEngine(tiny_qwen3).run(reads), tolerance=1e-5)
    assert split.outcomes[3].tokens_cached == len(head)
    # Below the split size, and without a cache (nothing outlives its use), states pack together as before.
    assert len(TreeEngine(tiny_qwen3, min_split_tokens=128, prefix_cache=PrefixCache(64 << 20))._chunks(reads)) == 1
    assert len(TreeEngine(tiny_qwen3, min_split_tokens=64)._chunks(reads)) == 1
    monkeypatch.undo()
    assert len(packed._chunks(reads)) == 1
    together = packed.run(reads)
    assert together.forward_passes == 1
    assert_same_reads(together, NaiveEngine(tiny_qwen3).run(reads), tolerance=1e-5)
