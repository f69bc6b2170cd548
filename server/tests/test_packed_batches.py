"""A batch of many requests is one forward pass (segments of one packed token stream), and every read of it equals
an independent transformers forward: reads packed beside other requests see nothing of theirs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import reference_sequence_logprob, use_segment_kernel

from decision_server.engines import ReadSpec, TreeEngine
from decision_server.engines.tree import DEFAULT_MAX_LOGIT_ROWS
from decision_server.model import LoadedModel
from decision_server.prefix_cache import PrefixCache
from decision_server.segments import NEW, PAST, AttentionSegment, KeyRange, SegmentLayout, ranges


def many_requests(requests: int, state_tokens: int, questions: int, seed: int = 5) -> list[ReadSpec]:
    """`requests` distinct states after one shared head, `questions` reads each (a question tail, then labels:
    single tokens and multi-token ones sharing a first token), in request order as the router sends them."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(5, 400, (count,), generator=generator).tolist())

    head = tokens(12)
    reads = []
    for _ in range(requests):
        state = head + tokens(state_tokens)
        for question in range(questions):
            reads.append(
                ReadSpec(
                    id=len(reads),
                    prompt=state + tokens(3 + question % 4),
                    labels=((7,), (8, 9), (8, 11, 12)),
                )
            )
    return reads


def assert_equals_transformers(reference: Any, reads: list[ReadSpec], outcomes: Any, tolerance: float) -> None:
    for read, outcome in zip(reads, outcomes.outcomes, strict=True):
        assert outcome.id == read.id
        expected = [reference_sequence_logprob(reference, list(read.prompt), list(label)) for label in read.labels]
        assert outcome.label_logprobs == pytest.approx(expected, abs=tolerance)


@pytest.mark.parametrize("kernel", ["split", "sdpa", "flex"], ids=["cpu-kernels", "sdpa-per-segment", "flex-one-call"])
def test_a_batch_of_requests_is_one_pass_equal_to_transformers(
    tiny_qwen3: LoadedModel, tiny_qwen3_reference: Any, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    use_segment_kernel(monkeypatch, tiny_qwen3, kernel)
    cache = PrefixCache(64 << 20)
    engine = TreeEngine(tiny_qwen3, prefix_cache=cache, min_split_tokens=64)
    cold = many_requests(requests=6, state_tokens=90, questions=3)
    first = engine.run(cold)
    assert first.forward_passes == 1
    assert_equals_transformers(tiny_qwen3_reference, cold, first, 1e-5)
    # Then the same states with new questions (continued from the cache, one root per state) beside new states.
    warm = [
        ReadSpec(id=100 + read.id, prompt=(*read.prompt[:-2], 41, 42, 43), labels=read.labels) for read in cold[::2]
    ] + [ReadSpec(id=200 + read.id, prompt=read.prompt, labels=read.labels) for read in many_requests(3, 90, 2, 9)]
    second = engine.run(warm)
    assert second.forward_passes == 1
    # All six states come from the cache (a cached position counts once per batch, on its first read).
    assert sum(outcome.tokens_cached for outcome in second.outcomes[:9]) >= 6 * 90
    assert_equals_transformers(tiny_qwen3_reference, warm, second, 1e-5)


def test_thirty_two_requests_of_eight_questions_are_one_pass(tiny_qwen3: LoadedModel) -> None:
    # The closed loop at concurrency 32, if all of it reached the shard as one batch: 32 distinct states of
    # ~512 tokens, 8 questions each. The default budget (8,192 prompt tokens, the router's) holds 15 of them: the
    # batch is three chunks and three passes, never one per request; under a budget that holds all it is one pass.
    reads = many_requests(requests=32, state_tokens=500, questions=8)
    engine = TreeEngine(tiny_qwen3)
    assert [len(chunk) // 8 for chunk in engine._chunks(reads)] == [15, 15, 2]
    whole = TreeEngine(tiny_qwen3, max_packed_tokens=32 * 540)
    batch = whole.run(reads)
    assert batch.forward_passes == 1
    assert batch.packed_tokens >= 32 * 512


def test_budgets_count_prompt_tokens_and_logit_rows(tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = TreeEngine(tiny_qwen3, max_packed_tokens=100, max_logit_rows=6)
    # Label branches are not prompt tokens: 2 reads of 50 prompt tokens (sharing none) fit 100 with their labels.
    reads = [ReadSpec(id=i, prompt=tuple(range(i * 50, i * 50 + 50)), labels=((1, 2, 3),)) for i in range(3)]
    assert [len(chunk) for chunk in engine._chunks(reads)] == [2, 1]
    # Each read takes 1 + 2 logit rows: two fit in six, whatever the token budget.
    engine.max_packed_tokens = 10**6
    assert [len(chunk) for chunk in engine._chunks(reads)] == [2, 1]
    # Without a given row budget, a model that packs segments (and computes logits in pieces of rows) is bounded by
    # tokens only; one that takes a dense mask by DEFAULT_MAX_LOGIT_ROWS.
    assert TreeEngine(tiny_qwen3, max_packed_tokens=65536).max_logit_rows == 65536
    monkeypatch.setattr(tiny_qwen3, "packs_segments", lambda: False)
    assert TreeEngine(tiny_qwen3, max_packed_tokens=65536).max_logit_rows == DEFAULT_MAX_LOGIT_ROWS


def test_a_batch_that_fits_is_one_chunk_without_a_trie(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_chunks`' shortcut (`_fits_one_chunk`: prompts less their prefix shared with the read before, an upper
    bound on the trie's tokens) chunks every batch as the trie does, and skips the trie where the batch fits."""
    generator = torch.Generator().manual_seed(7)
    engine = TreeEngine(tiny_qwen3)
    for trial in range(40):
        reads = many_requests(requests=1 + trial % 6, state_tokens=20 + 17 * trial, questions=1 + trial % 8)
        if trial % 3 == 0:  # salts, and requests interleaved
            reads = [replace(read, cache_salt=str(read.id % 2)) for read in reads]
            order = torch.randperm(len(reads), generator=generator).tolist()
            reads = [reads[i] for i in order]
        engine.max_packed_tokens = int(torch.randint(100, 3000, (1,), generator=generator))
        engine.max_logit_rows = int(torch.randint(4, 200, (1,), generator=generator))
        fast = engine._chunks(reads)
        with monkeypatch.context() as patched:
            patched.setattr(engine, "_fits_one_chunk", lambda reads: False)
            assert engine._chunks(reads) == fast
    engine.max_packed_tokens, engine.max_logit_rows = 10**6, 10**6
    monkeypatch.setattr("decision_server.engines.tree.TokenTrie.add_path", None)  # any trie use would fail
    reads = many_requests(requests=4, state_tokens=200, questions=8)
    assert engine._chunks(reads) == [reads]


def test_segment_layout_as_one_mask() -> None:
    # Two requests: state A (3 tokens), its two question branches (2 tokens each) seeing A whole, then state B
    # continuing 4 cached keys of which it sees the last 2 (another prefix's keys are not its own).
    branches = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=bool)
    layout = SegmentLayout(
        (
            AttentionSegment(0, 3, ()),
            AttentionSegment(3, 7, (KeyRange(NEW, 0, 3),), branches),
            AttentionSegment(7, 9, (KeyRange(PAST, 2, 4),)),
        )
    )
    layout.check(past_length=4)
    allowed = layout.dense_allowed(past_length=4)
    assert allowed.shape == (9, 13)
    assert allowed[:3, 4:7].tolist() == np.tril(np.ones((3, 3), dtype=bool)).tolist()
    assert not allowed[:7, :4].any() and not allowed[7:, :2].any() and allowed[7:, 2:4].all()
    assert allowed[3:7, 4:7].all() and allowed[3:7, 7:11].tolist() == branches.tolist()
    assert not allowed[7:, 4:11].any() and allowed[7:, 11:].tolist() == [[True, False], [True, True]]
    for segment in layout.segments:
        assert segment.own_rows([len(segment) - 1, 0]).tolist() == segment.own_allowed()[[len(segment) - 1, 0]].tolist()
    assert ranges([3, 4, 5, 9, 10, 2], NEW) == (KeyRange(NEW, 3, 6), KeyRange(NEW, 9, 11), KeyRange(NEW, 2, 3))


@pytest.mark.parametrize(
    ("segments", "problem"),
    [
        ((AttentionSegment(0, 2, ()), AttentionSegment(3, 4, ())), "tile"),
        ((AttentionSegment(0, 2, (KeyRange(PAST, 0, 5),)),), "past keys"),
        ((AttentionSegment(0, 2, (KeyRange(NEW, 0, 1),)),), "its own tokens"),
        ((AttentionSegment(0, 2, (KeyRange(NEW, 2, 3),)), AttentionSegment(2, 3, ())), None),
        ((AttentionSegment(0, 2, (KeyRange(NEW, 2, 9),)), AttentionSegment(2, 3, ())), "beyond"),
        ((AttentionSegment(0, 2, (), np.ones((3, 3), dtype=bool)),), "shape"),
    ],
)
def test_segment_layouts_are_checked(segments: tuple[AttentionSegment, ...], problem: str | None) -> None:
    layout = SegmentLayout(segments)
    if problem is None:
        layout.check(past_length=4)
    else:
        with pytest.raises(ValueError, match=problem):
            layout.check(past_length=4)


def test_logits_in_pieces_of_rows_equal_all_at_once(tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from decision_server import decoder_model

    reads = many_requests(requests=3, state_tokens=40, questions=4)
    whole = TreeEngine(tiny_qwen3).run(reads)
    # 12 reads of 4 kept rows each, in pieces of 5 rows: pieces end inside reads and inside label branches.
    monkeypatch.setattr(decoder_model, "LOGIT_PIECE_ROWS", 5)
    pieces = TreeEngine(tiny_qwen3).run(reads)
    for a, b in zip(whole.outcomes, pieces.outcomes, strict=True):
        assert a.label_logprobs == pytest.approx(b.label_logprobs, abs=1e-6)
        assert a.greedy_token_id == b.greedy_token_id


@pytest.mark.parametrize("requests", [1, 4], ids=["one-read-one-pass", "packed-batch"])
def test_the_cache_stores_a_pass_before_its_scores_are_waited_for(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch, requests: int
) -> None:
    # On a GPU a pass's scores reach the host in `LaunchedPass.finish`, the pass's one wait for the device. The
    # prefix cache's inserts (copies queued behind the pass, and their bookkeeping in Python) come before it, so they
    # run while the device computes. Recorded: what the cache holds when each pass's scores are collected.
    cache = PrefixCache(64 << 20)
    engine = TreeEngine(tiny_qwen3, prefix_cache=cache, min_split_tokens=64)
    held_when_collected: list[int] = []
    launch = tiny_qwen3.launch

    def recording_launch(request: Any) -> Any:
        launched = launch(request)
        collect = launched.collect

        def collect_after_recording() -> tuple[list[float], list[int]]:
            held_when_collected.append(cache.cached_tokens)
            return collect()

        launched.collect = collect_after_recording
        return launched

    monkeypatch.setattr(tiny_qwen3, "launch", recording_launch)
    reads = many_requests(requests=requests, state_tokens=60, questions=3 if requests > 1 else 1)
    batch = engine.run(reads)
    assert batch.forward_passes == 1
    # Every prompt token of the batch (less each answer position, never cached alone) was cached before the wait.
    unique = len({read.prompt[:end] for read in reads for end in range(1, len(read.prompt) + 1)})
    assert held_when_collected == [cache.cached_tokens] and cache.cached_tokens == unique
    monkeypatch.undo()
    for ours, uncached in zip(batch.outcomes, TreeEngine(tiny_qwen3).run(reads).outcomes, strict=True):
        assert ours.label_logprobs == pytest.approx(uncached.label_logprobs, abs=1e-5)


def test_a_batch_in_flight_on_the_device_is_finished_later_with_the_same_outcomes(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CPU a pass is done when it is launched, so a started batch is not in flight and the service answers it at
    # once. On a GPU the decoder's passes are in flight (`LaunchedPass.in_flight`): the started batch says so, and its
    # outcomes come in `finish`. Three chunks (a budget of two requests), each launched before any is collected.
    reads = many_requests(requests=5, state_tokens=50, questions=2)
    budget = 2 * (12 + 50 + 8)
    expected = TreeEngine(tiny_qwen3, max_packed_tokens=budget).run(reads)
    engine = TreeEngine(tiny_qwen3, max_packed_tokens=budget)
    assert not engine.start(reads).in_flight
    events: list[str] = []
    launch = tiny_qwen3.launch

    def in_flight_launch(request: Any) -> Any:
        launched = launch(request)
        events.append("launch")
        collect = launched.collect

        def collect_later() -> tuple[list[float], list[int]]:
            events.append("collect")
            return collect()

        return replace(launched, collect=collect_later, in_flight=True)

    monkeypatch.setattr(tiny_qwen3, "launch", in_flight_launch)
    started = TreeEngine(tiny_qwen3, max_packed_tokens=budget).start(reads)
    assert started.in_flight and events == ["launch"] * 3
    batch = started.finish()
    assert events == ["launch"] * 3 + ["collect"] * 3
    assert batch.forward_passes == expected.forward_passes == 3
    for ours, theirs in zip(batch.outcomes, expected.outcomes, strict=True):
        assert ours.id == theirs.id and ours.label_logprobs == theirs.label_logprobs
        assert ours.greedy_token_id == theirs.greedy_token_id
