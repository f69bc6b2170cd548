"""The prefix cache: radix-tree bookkeeping, and tree reads continuing from cached keys/values exactly."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import label_logprobs, read_request
from prompts import QUESTIONS, STATES, label_tokens, prompt_tokens
from test_tree_vs_naive import assert_same_reads, decision_batch

from decision_server.engines import NaiveEngine, ReadSpec, TreeEngine, make_engine
from decision_server.model import LoadedModel, wrap_module
from decision_server.prefix_cache import (
    AUTO_CONTEXTS,
    CachePlan,
    KeyValues,
    PrefixCache,
    auto_plan,
    free_memory_bytes,
    kv_bytes_per_token,
)
from decision_server.sequences import common_prefix

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


class ListingCache(PrefixCache):
    """The eviction rule written plainly, as the reference: every segment listed again for each victim, the least
    recently used leaf dropped, of equally recent ones the one created first."""

    def _evict(self) -> None:
        while self.bytes_used > self.capacity_bytes:
            leaves = [segment for segment in self._segments() if not segment.children]
            if not leaves:
                return
            victim = min(leaves, key=lambda segment: (segment.last_used, segment.uid))
            assert victim.parent is not None
            del victim.parent.children[victim.tokens[0]]
            self.bytes_used -= self._counted(victim)
            victim.keys = victim.values = None


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_eviction_from_a_heap_drops_what_relisting_every_segment_dropped(seed: int) -> None:
    """`_evict` takes victims from a heap kept as segments are used (stale entries skipped): the same victims as
    listing every segment again per victim, over a random workload of shared heads (splits), matches and two
    salts, long enough for the heap to be compacted several times."""
    generator = torch.Generator().manual_seed(seed)
    heads = [torch.randint(0, 5, (n,), generator=generator).tolist() for n in (6, 6, 3)]
    caches = [PrefixCache(capacity_bytes=BYTES_PER_TOKEN * 40), ListingCache(capacity_bytes=BYTES_PER_TOKEN * 40)]
    for step in range(3000):
        head = heads[int(torch.randint(0, 3, (1,), generator=generator))]
        tail = torch.randint(0, 5, (int(torch.randint(1, 9, (1,), generator=generator)),), generator=generator)
        tokens, salt = head + tail.tolist(), "ab"[step % 2]
        for cache in caches:
            if step % 3:
                cache.insert(salt, tokens, fake_provider(tokens, []))
            else:
                cache.match(salt, tokens)
        assert caches[0].bytes_used == caches[1].bytes_used <= BYTES_PER_TOKEN * 40
        assert [s.tokens for s in caches[0]._segments()] == [s.tokens for s in caches[1]._segments()]


def test_a_full_cache_evicts_without_listing_its_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inserting into a full cache costs O(log n) per victim, not a walk over every cached segment: listing them
    once per insert cost 1.8 s of host work per batch of 512 reads with 9,000 segments cached."""
    cache = PrefixCache(capacity_bytes=BYTES_PER_TOKEN * 200)
    generator = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(0, 50, (int(torch.randint(2, 12, (1,), generator=generator)),), generator=generator).tolist()
        for _ in range(400)
    ]

    def listed() -> list[Any]:
        raise AssertionError("eviction listed every segment")

    monkeypatch.setattr(cache, "_segments", listed)
    for tokens in prompts:
        cache.match("", tokens)
        cache.insert("", tokens, fake_provider(tokens, []))
        assert cache.bytes_used <= cache.capacity_bytes
    monkeypatch.undo()
    assert len(cache._candidates) <= 2 * len(cache._segments()) + 1024  # stale entries stay bounded


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


def cached_segments(cache: PrefixCache) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Every stored segment as (start, its tokens, its children's first tokens), sorted: the tree's shape."""
    return sorted((s.start, tuple(s.tokens), tuple(sorted(s.children))) for s in cache._segments())


def test_a_requests_state_is_cached_once_before_its_questions(
    tiny_qwen3: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine caches the state a request's questions share, then the questions under it: the cache takes the
    shape (and the bytes) that caching each prompt in turn gave, but no stored segment is cut where a request's
    questions leave its state (caching the first question's prompt whole and cutting it at the second copied the
    state's keys/values once more), and the cached keys/values still answer exactly (a warm batch equals a cold
    one). Cuts where different requests part (after the chat head they share) remain."""
    reads = decision_batch(tiny_qwen3.path)
    config = tiny_qwen3.text_config
    cuts: list[int] = []  # absolute positions of `_split` cuts
    split = PrefixCache._split
    monkeypatch.setattr(
        PrefixCache, "_split", lambda cache, segment, at: cuts.append(segment.start + at) or split(cache, segment, at)
    )
    reference = PrefixCache(64 << 20)
    for read in reads:

        def provide(start: int, length: int = len(read.prompt)) -> KeyValues:
            shape = (config.num_hidden_layers, config.num_key_value_heads, length - start, config.head_dim)
            return torch.zeros(shape), torch.zeros(shape)

        reference.insert(read.cache_salt, read.prompt, provide)
    # Where each request's questions leave its state (decision_batch: a read per state and question, in order).
    groups = [reads[i : i + len(QUESTIONS)] for i in range(0, len(STATES) * len(QUESTIONS), len(QUESTIONS))]
    state_ends = {common_prefix(group[0].prompt, group[1].prompt) for group in groups}
    assert state_ends & set(cuts)  # caching prompt by prompt cuts there
    cuts.clear()
    engine = TreeEngine(tiny_qwen3, prefix_cache=PrefixCache(64 << 20))
    cold = engine.run(reads)
    assert engine.prefix_cache is not None
    assert not state_ends & set(cuts), cuts
    assert cached_segments(engine.prefix_cache) == cached_segments(reference)
    assert engine.prefix_cache.bytes_used == reference.bytes_used
    assert_same_reads(engine.run(reads), cold, tolerance=1e-5)


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


def test_every_read_response_reports_the_bytes_the_cache_holds(tiny_qwen3: LoadedModel, shard: Any) -> None:
    """The router's `decision_prefix_cache_usage_ratio` is this field over Info's budget."""
    prompt = prompt_tokens(tiny_qwen3.path, STATES[0], QUESTIONS[0])
    request = read_request([(1, prompt, [[32], [33, 34]])])
    engine = make_engine("tree", tiny_qwen3, prefix_cache_mb=16)
    cache = engine.prefix_cache
    assert cache is not None
    with shard(tiny_qwen3, engine) as stub:
        first = stub.Read(request, timeout=60)
        assert 0 < first.prefix_cache_used_bytes == cache.bytes_used <= cache.capacity_bytes
        other = read_request([(2, prompt_tokens(tiny_qwen3.path, STATES[1], QUESTIONS[1]), [[32]])])
        assert stub.Read(other, timeout=60).prefix_cache_used_bytes == cache.bytes_used > first.prefix_cache_used_bytes
    with shard(tiny_qwen3, make_engine("tree", tiny_qwen3, prefix_cache_mb=0)) as stub:
        assert stub.Read(request, timeout=60).prefix_cache_used_bytes == 0


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


def test_auto_budget_counts_real_cached_bytes(tiny_qwen3: LoadedModel) -> None:
    """kv_bytes_per_token is what a cached token really costs: the rule's tokens are the cache's tokens."""
    engine = make_engine("tree", tiny_qwen3, prefix_cache_mb="auto")
    assert isinstance(engine, TreeEngine) and engine.prefix_cache is not None
    plan = engine.cache_plan
    assert plan.capacity_bytes == engine.prefix_cache.capacity_bytes > 0
    assert plan.rule.startswith("auto: ")
    engine.run(decision_batch(tiny_qwen3.path))
    cache = engine.prefix_cache
    assert cache.cached_tokens > 0
    assert cache.bytes_used == cache.cached_tokens * kv_bytes_per_token(tiny_qwen3.text_config, tiny_qwen3.dtype)


def test_auto_plan_takes_the_smaller_of_the_contexts_and_the_memory_share() -> None:
    mib = 1024 * 1024
    # Plenty of memory: 8 contexts of 4,096 tokens at 1 KiB each.
    roomy = auto_plan(per_token=1024, context=4096, free_bytes=64 * 1024 * mib, share=0.1, heads_share=(1, 1))
    assert roomy == CachePlan(AUTO_CONTEXTS * 4096 * 1024, "auto: 32 MiB, 32768 tokens (8 prompts of 4096 tokens)")
    # Under AUTO_MIN_BYTES: off, saying why.
    assert auto_plan(1024, 4096, 100 * mib, 0.1, (1, 1)) == CachePlan.off(
        "auto: off, 10 MiB (10% of the 100 MiB free) is under 16 MiB"
    )
    assert auto_plan(1024, 1000, 64 * 1024 * mib, 0.1, (1, 1)).rule == (
        "auto: off, 7 MiB (8 prompts of 1000 tokens) is under 16 MiB"
    )
    # Memory bound: a 10% share of 4 GiB.
    tight = auto_plan(per_token=1 << 20, context=100_000, free_bytes=4096 * mib, share=0.1, heads_share=(1, 1))
    assert tight.capacity_bytes == int(0.1 * 4096 * mib)
    assert tight.rule == "auto: 409 MiB, 409 tokens (10% of the 4096 MiB free)"
    # A rank holding a quarter of the heads stores a quarter of each token: the whole-model budget is 4x larger.
    quarter = auto_plan(per_token=1 << 20, context=100_000, free_bytes=4096 * mib, share=0.1, heads_share=(1, 4))
    assert quarter.capacity_bytes == int(0.1 * 4096 * mib * 4)


def test_free_memory_is_lowered_to_the_containers_limit() -> None:
    files = {"/proc/meminfo": "MemTotal: 1000 kB\nMemAvailable:    8000000 kB\n"}
    host = free_memory_bytes(torch.device("cpu"), files.get)
    assert host == 8_000_000 * 1024
    limited = dict(files, **{"/sys/fs/cgroup/memory.max": "3000000000\n", "/sys/fs/cgroup/memory.current": "1000\n"})
    assert free_memory_bytes(torch.device("cpu"), limited.get) == 3_000_000_000 - 1000
    unlimited = dict(files, **{"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "1000\n"})
    assert free_memory_bytes(torch.device("cpu"), unlimited.get) == host


def test_plans_name_why_there_is_no_cache(tiny_qwen3: LoadedModel) -> None:
    off = make_engine("tree", tiny_qwen3, prefix_cache_mb=0)
    assert isinstance(off, TreeEngine) and off.prefix_cache is None
    assert off.cache_plan == CachePlan.off("off: --prefix-cache-mb 0")
    naive = make_engine("naive", tiny_qwen3, prefix_cache_mb="auto")
    assert naive.cache_plan == CachePlan.off("off: the naive engine keeps no prefixes")
    fixed = make_engine("tree", tiny_qwen3, prefix_cache_mb=3)
    assert fixed.cache_plan == CachePlan(3 * 1024 * 1024, "--prefix-cache-mb 3")
    with pytest.raises(ValueError, match="auto or 0 or more"):
        make_engine("tree", tiny_qwen3, prefix_cache_mb=-1)


def test_info_reports_the_plan(tiny_qwen3: LoadedModel, shard: Any) -> None:
    from decision_server.pb import decision_pb2

    engine = make_engine("tree", tiny_qwen3, prefix_cache_mb="auto")
    with shard(tiny_qwen3, engine) as stub:
        info = stub.Info(decision_pb2.InfoRequest(), timeout=30)
    assert info.prefix_cache_bytes == engine.cache_plan.capacity_bytes > 0
    assert info.prefix_cache_rule == engine.cache_plan.rule


def test_a_cached_slice_does_not_keep_its_whole_pass_alive() -> None:
    """The budget counts what the cache holds: a segment supplied as a slice of a larger pass's keys is copied
    into storage of its own size, so the pass's tensor can be freed (it was kept whole, past the budget)."""
    cache = PrefixCache(capacity_bytes=1 << 30)
    pass_keys = torch.zeros(2, 1, 1000, 4)  # a whole pass: 1,000 tokens
    tokens = list(range(10))
    cache.insert("", tokens, lambda start: (pass_keys[:, :, 500 + start : 510], pass_keys[:, :, 500 + start : 510]))
    (segment,) = cache._root("").children.values()
    assert segment.keys is not None and segment.values is not None
    assert segment.keys.untyped_storage().nbytes() == segment.keys.nbytes == 2 * 10 * 4 * 4
    assert segment.values.untyped_storage().nbytes() == segment.values.nbytes
    assert cache.bytes_used == 2 * segment.keys.nbytes


# A growing cache's inserts in a fresh shard process, with the allocator the launcher gives shards (tcmalloc where
# installed, else glibc with its tunables): page faults while 96 MiB of keys/values are stored, with and without
# `PrefixCache.prefault` at startup. Prints the faults per stored page.
PREFAULT_PROBE = """
import resource, sys, torch
from decision_server.prefix_cache import PrefixCache
cache = PrefixCache(capacity_bytes=128 << 20)
if sys.argv[1] == "prefault":
    cache.prefault()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
stored = [torch.ones(12 << 20, dtype=torch.uint8) for _ in range(8)]
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / ((96 << 20) / 4096))
"""


def stored_page_faults(mode: str) -> float:
    tcmalloc = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    env = dict(os.environ)
    if tcmalloc.is_file():
        env["LD_PRELOAD"] = str(tcmalloc)
    else:
        env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"
    run = subprocess.run(
        [sys.executable, "-c", PREFAULT_PROBE, mode], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return float(run.stdout.split()[-1])


def test_prefault_at_startup_spares_a_growing_cache_its_page_faults() -> None:
    """Every insert of a cache that is still filling takes new memory; a first touch of a page cost about 5 us on the
    VMs measured, 12 % of a bfloat16 read (PrefixCache.prefault). After the shard touches its budget at warm-up the
    allocator hands those pages out again: almost no fault per stored page, against about one without it."""
    cold, warm = stored_page_faults("cold"), stored_page_faults("prefault")
    assert cold > 0.5, cold  # the control: without the prefault every stored page faults in
    assert warm < 0.1, (warm, cold)
