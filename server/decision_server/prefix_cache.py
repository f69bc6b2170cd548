"""A radix tree of recently computed prompt prefixes and their per-layer keys/values, LRU under a byte budget.
A repeated chat head + state then costs only the new question tokens; salts partition the tree entirely."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from decision_server.sequences import common_prefix

# Keys and values of a run of tokens: (layers, kv_heads, tokens, head_dim) each.
KeyValues = tuple[torch.Tensor, torch.Tensor]
# `PrefixCache.prefault` touches host memory in blocks of this size.
PREFAULT_BLOCK_BYTES = 16 << 20


@dataclass(eq=False)
class Segment:
    """A run of tokens stored together; its first token is at position `start` of every prompt through it."""

    uid: int
    start: int
    tokens: tuple[int, ...]
    keys: torch.Tensor | None
    values: torch.Tensor | None
    parent: Segment | None
    children: dict[int, Segment] = field(default_factory=dict)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class CachedPrefix:
    """The longest cached prefix of a prompt: (segment, tokens used from it) pieces from the root down."""

    salt: str
    pieces: tuple[tuple[Segment, int], ...]

    @property
    def length(self) -> int:
        return sum(used for _, used in self.pieces)

    @property
    def key(self) -> tuple[str, int, int]:
        """Identifies the attachment point: reads with equal keys continue from the very same cached tokens."""
        if not self.pieces:
            return (self.salt, -1, 0)
        segment, used = self.pieces[-1]
        return (self.salt, segment.uid, used)


class PrefixCache:
    """`capacity_bytes` budgets the whole model's keys/values. A tensor-parallel rank stores only its key/value
    heads, `heads_share` = (heads here, heads in all), and counts each segment at its whole-model size: every
    rank then evicts exactly the same segments, so the ranks' caches, and their forward passes, never diverge."""

    def __init__(self, capacity_bytes: int, heads_share: tuple[int, int] = (1, 1)) -> None:
        if capacity_bytes <= 0:
            raise ValueError("prefix cache capacity must be positive")
        if not 0 < heads_share[0] <= heads_share[1]:
            raise ValueError(f"invalid key/value heads share {heads_share}")
        self.capacity_bytes = capacity_bytes
        self.heads_share = heads_share
        self.bytes_used = 0
        self._uids = itertools.count()
        self._clock = itertools.count(1)
        self._roots: dict[str, Segment] = {}
        # Eviction candidates, (last_used, uid, segment), pushed whenever a segment is used or becomes a leaf; an
        # entry is stale once its segment was used again, got children or was evicted (`_victim` skips those).
        # Victims come out in O(log n) each, without listing the cache: listing it once per insert cost 1.8 s of
        # host work per batch of 512 reads with 9,000 segments cached (bench/results/2026-12-07-evict/).
        self._candidates: list[tuple[int, int, Segment]] = []
        self._live = 0  # segments stored (roots excluded): bounds the stale entries kept

    def prefault(self) -> float:
        """Touches this rank's share of the budget in host memory once and frees it again; returns the seconds taken.

        A growing cache takes new memory for every insert until it is full, and the first touch of a page of host
        memory is slow on the VMs measured: about 5 us per 4 KiB page (a 49 MB tensor: 60-80 ms). Until the cache
        filled, that was 12 % of a bfloat16 read of 8 questions over 540 tokens (Qwen3-0.6B shape, 2 vCPUs: 1.30-1.35 s
        against 1.13-1.20 s without a cache; bench/results/2026-12-04-zen5/). The allocator keeps the pages touched
        here and hands them out again (tcmalloc; glibc with the launcher's tunables keeps blocks under 32 MiB), as
        vLLM's CPU backend allocates its whole KV cache at startup. Blocks of 16 MiB, so that either allocator keeps
        them."""
        started = time.perf_counter()
        here, total = self.heads_share
        remaining = self.capacity_bytes * here // total
        blocks = []
        while remaining > 0:
            size = min(remaining, PREFAULT_BLOCK_BYTES)
            blocks.append(torch.ones(size, dtype=torch.uint8))
            remaining -= size
        del blocks
        return time.perf_counter() - started

    def _root(self, salt: str) -> Segment:
        if salt not in self._roots:
            self._roots[salt] = Segment(uid=next(self._uids), start=0, tokens=(), keys=None, values=None, parent=None)
        return self._roots[salt]

    def match(self, salt: str, tokens: Sequence[int]) -> CachedPrefix:
        """The longest cached prefix of `tokens` (marks the segments it uses as recently used)."""
        now = next(self._clock)
        pieces: list[tuple[Segment, int]] = []
        node = self._roots.get(salt)
        position = 0
        while node is not None and position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None:
                break
            used = _common_length(child.tokens, tokens, position)
            self._use(child, now)
            pieces.append((child, used))
            position += used
            if used < len(child.tokens):
                break
            node = child
        return CachedPrefix(salt=salt, pieces=tuple(pieces))

    def insert(self, salt: str, tokens: Sequence[int], provide: Callable[[int], KeyValues | None]) -> None:
        """Caches `tokens`; `provide(m)` returns the keys/values of tokens[m:], or None when it cannot.

        Only the part not already cached is asked for. If the cached part ends before what the caller
        computed (an ancestor was evicted meanwhile), `provide` returns None and nothing is stored.
        """
        now = next(self._clock)
        node = self._root(salt)
        position = 0
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None:
                break
            used = _common_length(child.tokens, tokens, position)
            self._use(child, now)
            if used < len(child.tokens):
                child = self._split(child, used)
            node = child
            position += used
        if position >= len(tokens):
            return
        supplied = provide(position)
        if supplied is None:
            return
        keys, values = (_owned(tensor) for tensor in supplied)
        leaf = Segment(
            uid=next(self._uids),
            start=position,
            tokens=tuple(tokens[position:]),
            keys=keys,
            values=values,
            parent=node,
            last_used=now,
        )
        node.children[leaf.tokens[0]] = leaf
        self._live += 1
        self._push(leaf)
        self.bytes_used += self._counted(leaf)
        self._evict()

    def _split(self, segment: Segment, at: int) -> Segment:
        """Cuts `segment` after `at` tokens; the head keeps the identity and parent, the tail takes the children."""
        assert segment.keys is not None and segment.values is not None
        tail = Segment(
            uid=next(self._uids),
            start=segment.start + at,
            tokens=segment.tokens[at:],
            keys=segment.keys[:, :, at:].clone(),
            values=segment.values[:, :, at:].clone(),
            parent=segment,
            children=segment.children,
            last_used=segment.last_used,
        )
        for child in tail.children.values():
            child.parent = tail
        self._live += 1
        self._push(tail)
        before = self._counted(segment)
        segment.tokens = segment.tokens[:at]
        segment.keys = segment.keys[:, :, :at].clone()
        segment.values = segment.values[:, :, :at].clone()
        segment.children = {tail.tokens[0]: tail}
        self.bytes_used += self._counted(segment) + self._counted(tail) - before
        return segment

    def _use(self, segment: Segment, now: int) -> None:
        segment.last_used = now
        self._push(segment)

    def _push(self, segment: Segment) -> None:
        heapq.heappush(self._candidates, (segment.last_used, segment.uid, segment))
        if len(self._candidates) > 2 * self._live + 1024:
            # Mostly stale entries: keep the current ones (at most one per segment; use pushes a new one).
            self._candidates = [entry for entry in self._candidates if self._current(entry)]
            heapq.heapify(self._candidates)

    @staticmethod
    def _current(entry: tuple[int, int, Segment]) -> bool:
        """The entry still describes its segment: stored, and not used since it was pushed."""
        last_used, _, segment = entry
        return segment.keys is not None and segment.last_used == last_used

    def _victim(self) -> Segment | None:
        """The least recently used leaf (of those used equally long ago, the one created first), or None."""
        candidates = self._candidates
        while candidates:
            entry = candidates[0]
            if self._current(entry) and not entry[2].children:
                return entry[2]
            heapq.heappop(candidates)
        return None

    def _evict(self) -> None:
        """Drops the least recently used leaf until the cache fits its budget (a parent left without children is a
        leaf from then on). Ties go to the segment created first, so every rank of a tensor-parallel group, doing
        the same inserts, evicts the same segments."""
        while self.bytes_used > self.capacity_bytes:
            victim = self._victim()
            if victim is None:
                return
            parent = victim.parent
            assert parent is not None
            del parent.children[victim.tokens[0]]
            self.bytes_used -= self._counted(victim)
            victim.keys = victim.values = None
            self._live -= 1
            if not parent.children and parent.parent is not None:  # roots (no parent) are never evicted
                # A parent's entry may be current already (pushed when it was last used); one more does no harm.
                self._push(parent)

    def _counted(self, segment: Segment) -> int:
        """The segment's bytes as the whole model would hold them (exact: a rank's bytes divide by its heads)."""
        here, total = self.heads_share
        return segment.nbytes // here * total

    def _segments(self) -> list[Segment]:
        found: list[Segment] = []
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            segment = stack.pop()
            found.append(segment)
            stack.extend(segment.children.values())
        return found

    @property
    def cached_tokens(self) -> int:
        return sum(len(segment.tokens) for segment in self._segments())


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in storage of its own size: a slice of a whole pass's keys would keep that pass's storage alive
    while the budget counts only the slice (a soak grew the shard 1 GB past its cache budget that way)."""
    if tensor.untyped_storage().nbytes() > tensor.nbytes:
        return tensor.clone()
    return tensor


def _common_length(stored: tuple[int, ...], tokens: Sequence[int], offset: int) -> int:
    """How many of `stored` equal `tokens` from `offset` on (`sequences.common_prefix`: in C, not per token; a
    whole match, the usual case on a walk down the tree, is checked first)."""
    return common_prefix(stored, tuple(tokens[offset : offset + len(stored)]), len(stored))


# The `--prefix-cache-mb auto` rule: room for AUTO_CONTEXTS prompts of the model's full length, within a share of
# the memory free once the weights are loaded (host memory on CPU, where the ranks of a group share it; each
# device's own memory on CUDA). Like vLLM and SGLang it is sized from the model's key/value bytes per token, but a
# decision read keeps no generation state, so it takes a small share rather than most of the memory.
AUTO_CONTEXTS = 8
AUTO_HOST_SHARE = 0.10
AUTO_DEVICE_SHARE = 0.30
# Below this a cache holds too little to pay for its bookkeeping: the rule turns it off instead.
AUTO_MIN_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CachePlan:
    """The prefix cache a shard runs with: `capacity_bytes` of the whole model's keys/values (0: off) and `rule`,
    the sentence Info shows for how that number was chosen or why there is no cache."""

    capacity_bytes: int
    rule: str

    @classmethod
    def off(cls, reason: str) -> CachePlan:
        return cls(0, reason)


def kv_bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values over every layer of the whole model."""
    layers = int(text_config.num_hidden_layers)
    heads = int(getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads)
    head_dim = int(getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads)
    return 2 * layers * heads * head_dim * dtype.itemsize


def free_memory_bytes(device: torch.device, read: Callable[[str], str | None] = lambda path: _read_text(path)) -> int:
    """Memory free for new tensors: the device's on CUDA; on CPU the host's MemAvailable, lowered to what the
    process's cgroup (a container's memory limit) still allows."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    meminfo = read("/proc/meminfo") or ""
    available = next(
        (int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), 0
    )
    limit, current = read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")
    if limit is not None and current is not None and limit.strip().isdigit() and current.strip().isdigit():
        available = min(available, max(0, int(limit) - int(current)))
    return available


def auto_plan(per_token: int, context: int, free_bytes: int, share: float, heads_share: tuple[int, int]) -> CachePlan:
    """The auto budget: AUTO_CONTEXTS full-length prompts, at most `share` of `free_bytes` held on this rank
    (which stores `heads_share` of every token), and off when that is under AUTO_MIN_BYTES."""
    wanted = AUTO_CONTEXTS * context * per_token
    allowed = int(share * free_bytes * heads_share[1] / heads_share[0])
    capacity = min(wanted, allowed)
    mib = 1024 * 1024
    bound = (
        f"{AUTO_CONTEXTS} prompts of {context} tokens"
        if wanted <= allowed
        else f"{share:.0%} of the {free_bytes // mib} MiB free"
    )
    if capacity < AUTO_MIN_BYTES:
        return CachePlan.off(f"auto: off, {capacity // mib} MiB ({bound}) is under {AUTO_MIN_BYTES // mib} MiB")
    return CachePlan(capacity, f"auto: {capacity // mib} MiB, {capacity // per_token} tokens ({bound})")


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None
