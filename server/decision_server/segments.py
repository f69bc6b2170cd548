"""The attention layout of one packed forward pass: which keys each run of the packed tokens may see.

A batch's reads (every request's states, questions and label branches) are packed into one token stream, so every
weight GEMM runs once per layer over all of them. Attention is the one thing that must stay per request: a token
sees its own ancestors only. The stream is cut into `AttentionSegment`s, each a contiguous run of tokens that all
see the same keys whole (their `past`: cached keys of the prefix cache, and earlier runs of the stream, such as the
state a question continues) and, among themselves, either a causal chain or their tree ancestors (`tree`). A model
that attends segment by segment (`LoadedModel.packs_segments`) never computes a product between unrelated requests,
whatever their number; `dense_allowed` is the same layout as one boolean matrix, the reference it is tested against.

Within one layer every token's keys/values come from the previous layer, so a segment may see keys of any other run
of the same pass: the state and the questions about it are computed together, not in passes one after another.
This module is plain numpy and device-free: the tree engine builds layouts, the model decides which kernels run them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAST = "past"  # keys the pass continues from (prefix cache), laid out before the pass's own tokens
NEW = "new"  # the pass's own tokens' keys, in stream order


@dataclass(frozen=True)
class KeyRange:
    """Keys [start, end) of `source` (PAST or NEW)."""

    source: str
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class AttentionSegment:
    """Stream tokens [start, end): each sees every key of `past` and, among the segment's own tokens, itself and
    its ancestors. `tree` (n, n) booleans says which own tokens each may see; None means a causal chain."""

    start: int
    end: int
    past: tuple[KeyRange, ...]
    tree: np.ndarray | None = None

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def past_length(self) -> int:
        return sum(len(piece) for piece in self.past)

    def own_allowed(self) -> np.ndarray:
        """(n, n) booleans: own token i may see own token j."""
        return self.own_rows(range(len(self)))

    def own_rows(self, rows: Sequence[int]) -> np.ndarray:
        """(len(rows), n) booleans: the `own_allowed` rows of own tokens `rows`, without building the others."""
        if self.tree is not None:
            return self.tree[list(rows)]
        return np.arange(len(self))[None, :] <= np.asarray(rows, dtype=np.int64)[:, None]


@dataclass(frozen=True)
class SegmentLayout:
    """A packed pass's segments, in stream order, covering tokens 0 .. tokens - 1 exactly once."""

    segments: tuple[AttentionSegment, ...]

    @property
    def tokens(self) -> int:
        return self.segments[-1].end if self.segments else 0

    def check(self, past_length: int) -> None:
        """Raises ValueError unless the segments tile the stream in order and every key range exists; `NEW` keys a
        segment sees as its past must be of other segments (its own are its `tree`)."""
        at = 0
        for segment in self.segments:
            if segment.start != at or segment.end <= segment.start:
                raise ValueError(f"segments must tile the stream in order: {segment.start}..{segment.end} at {at}")
            if segment.tree is not None and segment.tree.shape != (len(segment), len(segment)):
                raise ValueError(f"segment {segment.start}..{segment.end} has a tree of shape {segment.tree.shape}")
            for piece in segment.past:
                limit = past_length if piece.source == PAST else None
                if piece.source not in (PAST, NEW) or piece.start < 0 or piece.end <= piece.start:
                    raise ValueError(f"bad key range {piece}")
                if limit is not None and piece.end > limit:
                    raise ValueError(f"key range {piece} beyond the {limit} past keys")
                if piece.source == NEW and piece.start < segment.end and piece.end > segment.start:
                    raise ValueError(f"segment {segment.start}..{segment.end} sees its own tokens as past")
            at = segment.end
        for segment in self.segments:
            for piece in segment.past:
                if piece.source == NEW and piece.end > at:
                    raise ValueError(f"key range {piece} beyond the {at} tokens of the stream")

    def dense_allowed(self, past_length: int) -> np.ndarray:
        """(tokens, past_length + tokens) booleans, past keys first: the whole layout as one mask."""
        tokens = self.tokens
        allowed = np.zeros((tokens, past_length + tokens), dtype=bool)
        for segment in self.segments:
            rows = slice(segment.start, segment.end)
            for piece in segment.past:
                offset = 0 if piece.source == PAST else past_length
                allowed[rows, offset + piece.start : offset + piece.end] = True
            allowed[rows, past_length + segment.start : past_length + segment.end] = segment.own_allowed()
        return allowed


def ranges(positions: Sequence[int] | np.ndarray, source: str) -> tuple[KeyRange, ...]:
    """`positions` (ascending or not) as the fewest runs of consecutive positions, in the given order. In array
    steps: a question tree's past is its state's hundreds of positions, and a batch lays out one per state (a Python
    step per position was 12 ms of a 64 x 8 x 512 batch's host work, bench/results/2026-12-07-plan/)."""
    array = np.asarray(positions, dtype=np.int64)
    if not array.size:
        return ()
    cuts = np.flatnonzero(np.diff(array) != 1) + 1
    firsts = array[np.concatenate(([0], cuts))].tolist()
    lasts = array[np.concatenate((cuts - 1, [array.size - 1]))].tolist()
    return tuple(KeyRange(source, first, last + 1) for first, last in zip(firsts, lasts, strict=True))


@functools.lru_cache(maxsize=64)
def causal_rows(size: int) -> np.ndarray:
    """(size, size) booleans, row i sees 0..i; shared and read-only (a batch's questions and labels come in a few
    lengths, so the planner and the FlexAttention tables reuse them)."""
    causal = np.tri(size, dtype=bool)
    causal.flags.writeable = False
    return causal
