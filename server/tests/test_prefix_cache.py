"""The prefix cache: radix-tree bookkeeping, and tree reads continuing from cached keys/values exactly."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import label_logprobs, read_request
from prompts import QUESTIONS, STATES, label_tokens, prompt_tokens
from test_tree_vs_naive import assert_same_reads, decision_batch

from decision_server.engines import NaiveEngine, ReadSpec, TreeEngine, make_engine
from decision_server.model import LoadedModel, wrap_module
from decision_server.prefix_cache import KeyValues, PrefixCache

# Fake keys/values for bookkeeping tests: 2 layers, 1 head, head_dim 1, value = the token's position,
# so a slice that comes back from the wrong place is visible. 16 bytes per token (keys + values, float32).
BYTES_PER_TOKEN = 16


def fake_provider(tokens: list[int], log: list[int]) -> Any:
    def provide(start: int) -> KeyValues:
        log.append(start)
        positions = torch.arange(start, len(tokens), dtype=torch.float32).view(1, 1, -1, 1).expand(2, 1, -1, 1)
        return positions.clone(), positions.clone()

    return provide


def test_match_insert_split_and_salts() -> None:
    cache = PrefixCache(capacity_bytes=1 << 20)
    first = [1, 2, 3, 4, 5]
    asked: list[int] = []
    cache.insert("", first, fake_provider(first, asked))
    assert asked == [0]
    assert cache.match("", [1, 2, 3, 9]).length == 3
    assert cache.match("other-salt", first).length == 0

    # A second prompt diverging inside the stored run splits it; only the new tail is asked for.
    second = [1, 2, 3, 7, 8]
    cache.insert("", second, fake_provider(second, asked))
    assert asked == [0, 3]
    prefix = cache.match("", [1, 2, 3, 7, 8, 9])
    assert prefix.length == 5
    assert [used for _, used in prefix.pieces] == [3, 2]
    head, tail = (segment for segment, _ in prefix.pieces)
    assert head.keys is not None and tail.keys is not None
    assert head.keys[0, 0, :, 0].tolist() == [0, 1, 2]
    assert tail.keys[0, 0, :, 0].tolist() == [3, 4]
    assert tail.start == 3
    assert cache.match("", first).length == 5  # the other branch survived the split
    assert cache.bytes_used == BYTES_PER_TOKEN * 7
    assert cache.cached_tokens == 7

    # Already cached: nothing asked, nothing stored.
    cache.insert("", first[:4], fake_provider(first, asked))
    assert asked == [0, 3]


def test_least_recently_used_leaves_are_evicted_first() -> None:
    cache = PrefixCache(capacity_bytes=BYTES_PER_TOKEN * 8)
    log: list[int] = []
    a, b, c = [1, 2, 3, 4], [1, 2, 5, 6], [9, 9, 9, 9]
    cache.insert("", a, fake_provider(a, log))
    cache.insert("", b, fake_provider(b, log))  # shares [1, 2]: 6 tokens stored
    cache.match("", a)  # a is now more recent than b
    cache.insert("", c, fake_provider(c, log))  # 10 tokens > 8: evicts b's leaf [5, 6]
    assert cache.bytes_used <= cache.capacity_bytes
    assert cache.match("", a).length == 4
    assert cache.match("", b).length == 2
    assert cache.match("", c).length == 4


def test_insert_after_eviction_of_the_prefix_stores_nothing() -> None:
    cache = PrefixCache(capacity_bytes=1 << 20)
    tokens = [1, 2, 3, 4]
    # The caller computed only tokens[2:] (it continued from a cached [1, 2] that is gone now): it cannot fill
    # the gap, so the cache must not store a path with a hole.
    cache.insert("", tokens, lambda start: None if start < 2 else fake_provider(tokens, [])(start))
    assert cache.match("", tokens).length == 0
    assert cache.bytes_used == 0


@pytest.mark.parametrize("name", ["smollm2", "tiny_qwen3"])
def test_cached_reads_equal_naive_reads(request: pytest.FixtureRequest, naive_outcomes: Any, name: str) -> None:
    model = request.getfixturevalue(name)
    reads = decision_batch(model.path)
    engine = TreeEngine(model, prefix_cache=PrefixCache(64 << 20))
    cold = engine.run(reads)
    assert [o.tokens_cached for o in cold.outcomes] == [0] * len(reads)
    assert [o.tokens_computed for o in cold.outcomes] == [
        o.tokens_computed for o in TreeEngine(model).run(reads).outcomes
    ]
    naive = naive_outcomes(model, reads)
    assert_same_reads(cold, naive)

    warm = engine.run(reads)
    assert_same_reads(warm, naive)
    # Everything but each read's answer token came from the cache, counted once per batch like computed tokens.
    unique = len({read.prompt[:end] for read in reads for end in range(1, len(read.prompt) + 1)})
    assert [o.tokens_computed for o in warm.outcomes] == [1] * len(reads)
    assert sum(o.tokens_cached for o in warm.outcomes) + len(reads) >= unique - len(reads)
    assert warm.packed_tokens < cold.packed_tokens // 5


def test_a_new_question_on_a_cached_state_computes_only_its_tail(tiny_qwen3: LoadedModel) -> None:
    engine = TreeEngine(tiny_qwen3, prefix_cache=PrefixCache(64 << 20))
    labels = tuple(tuple(label_tokens(tiny_qwen3.path, text)) for text in ("A", "B", "refund please"))
    earlier = [
        ReadSpec(id=i, prompt=tuple(prompt_tokens(tiny_qwen3.path, STATES[0], q)), labels=labels)
        for i, q in enumerate(QUESTIONS[:2])
    ]
    engine.run(earlier)
    new = ReadSpec(id=9, prompt=tuple(prompt_tokens(tiny_qwen3.path, STATES[0], QUESTIONS[2])), labels=labels)
    shared = max(
        next((i for i, (a, b) in enumerate(zip(e.prompt, new.prompt, strict=False)) if a != b), 0) for e in earlier
    )
    assert shared > 10
    (outcome,) = engine.run([new]).outcomes
    assert (outcome.tokens_cached, outcome.tokens_computed) == (shared, len(new.prompt) - shared)
    (reference,) = NaiveEngine(tiny_qwen3).run([new]).outcomes
    assert outcome.label_logprobs == pytest.approx(reference.label_logprobs, abs=1e-5)
    assert outcome.greedy_token_id == reference.greedy_token_id


def test_salted_reads_never_hit_each_others_cache(tiny_qwen3: LoadedModel) -> None:
    engine = TreeEngine(tiny_qwen3, prefix_cache=PrefixCache(64 << 20))
    prompt = tuple(prompt_tokens(tiny_qwen3.path, STATES[1], QUESTIONS[1]))
    engine.run([ReadSpec(id=1, prompt=prompt, labels=((9693,),), cache_salt="tenant-a")])
    (other,) = engine.run([ReadSpec(id=2, prompt=prompt, labels=((9693,),), cache_salt="tenant-b")]).outcomes
    assert (other.tokens_cached, other.tokens_computed) == (0, len(prompt))
    (same,) = engine.run([ReadSpec(id=3, prompt=prompt, labels=((9693,),), cache_salt="tenant-a")]).outcomes
    assert (same.tokens_cached, same.tokens_computed) == (len(prompt) - 1, 1)
    assert same.label_logprobs == pytest.approx(other.label_logprobs, abs=1e-5)


def test_a_tight_budget_evicts_and_stays_exact(tiny_qwen3: LoadedModel, naive_outcomes: Any) -> None:
    config = tiny_qwen3.text_config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    reads = decision_batch(tiny_qwen3.path)
    cache = PrefixCache(per_token * 80)  # room for about one prompt
    engine = TreeEngine(tiny_qwen3, prefix_cache=cache)
    naive = naive_outcomes(tiny_qwen3, reads)
    for _ in range(3):
        assert_same_reads(engine.run(reads), naive, tolerance=1e-5)
        assert 0 < cache.bytes_used <= cache.capacity_bytes


def test_cached_tokens_reach_the_client(tiny_qwen3: LoadedModel, shard: Any) -> None:
    prompt = prompt_tokens(tiny_qwen3.path, STATES[0], QUESTIONS[0])
    request = read_request([(1, prompt, [[32], [33, 34]])])
    with shard(tiny_qwen3, make_engine("tree", tiny_qwen3, prefix_cache_mb=16)) as stub:
        (cold,) = stub.Read(request, timeout=60).results
        (warm,) = stub.Read(request, timeout=60).results
    assert (cold.tokens_cached, cold.tokens_computed) == (0, len(prompt))
    assert (warm.tokens_cached, warm.tokens_computed) == (len(prompt) - 1, 1)
    assert label_logprobs(warm) == pytest.approx(label_logprobs(cold), abs=1e-5)


def test_sliding_window_models_get_no_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
    )
    model: LoadedModel = wrap_module(Qwen3ForCausalLM(config), tmp_path, torch.device("cpu"), torch.float32)
    with caplog.at_level(logging.WARNING):
        engine = make_engine("tree", model, prefix_cache_mb=8)
    assert isinstance(engine, TreeEngine) and engine.prefix_cache is None
    assert "prefix cache disabled" in caplog.text
    with pytest.raises(ValueError, match="sliding-window"):
        TreeEngine(model, prefix_cache=PrefixCache(1 << 20))
