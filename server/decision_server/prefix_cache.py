"""A radix tree of recently computed prompt prefixes and their per-layer keys/values, LRU under a byte budget.
A repeated chat head + state then costs only the new question tokens; salts partition the tree entirely."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

# Keys and values of a run of tokens: (layers, kv_heads, tokens, head_dim) each.
KeyValues = tuple[torch.Tensor, torch.Tensor]


@dataclass(eq=False)
class Segment:
    """A run of tokens stored together; its first token is at position `start` of every prompt through it."""

    uid: int
    start: int
    tokens: list[int]
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

    def _root(self, salt: str) -> Segment:
        if salt not in self._roots:
            self._roots[salt] = Segment(uid=next(self._uids), start=0, tokens=[], keys=None, values=None, parent=None)
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
            child.last_used = now
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
            child.last_used = now
            if used < len(child.tokens):
                child = self._split(child, used)
            node = child
            position += used
        if position >= len(tokens):
            return
        supplied = provide(position)
        if supplied is None:
            return
        keys, values = supplied
        leaf = Segment(
            uid=next(self._uids),
            start=position,
            tokens=list(tokens[position:]),
            keys=keys,
            values=values,
            parent=node,
            last_used=now,
        )
        node.children[leaf.tokens[0]] = leaf
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
        before = self._counted(segment)
        segment.tokens = segment.tokens[:at]
        segment.keys = segment.keys[:, :, :at].clone()
        segment.values = segment.values[:, :, :at].clone()
        segment.children = {tail.tokens[0]: tail}
        self.bytes_used += self._counted(segment) + self._counted(tail) - before
        return segment

    def _evict(self) -> None:
        while self.bytes_used > self.capacity_bytes:
            leaves = [segment for segment in self._segments() if not segment.children]
            if not leaves:
                return
            victim = min(leaves, key=lambda segment: segment.last_used)
            parent = victim.parent
            assert parent is not None
            del parent.children[victim.tokens[0]]
            self.bytes_used -= self._counted(victim)
            victim.keys = victim.values = None

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


def _common_length(stored: Sequence[int], tokens: Sequence[int], offset: int) -> int:
    limit = min(len(stored), len(tokens) - offset)
    count = 0
    while count < limit and stored[count] == tokens[offset + count]:
        count += 1
    return count
