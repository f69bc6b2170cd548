"""Segment attention as one FlexAttention call per layer: every segment of a packed pass (`segments.SegmentLayout`)
attended at once, with a block mask built from the layout so that no block between unrelated requests is computed.

The per-segment form (`decoder.SegmentPlan`, one SDPA call per segment) launches about two kernels per request per
layer; on a GPU that host work, not arithmetic, bounds a packed batch. Here one compiled kernel takes the whole
stream: the block lists (which 128 x 128 tiles of queries x keys hold an allowed pair, and which are allowed whole)
come from the layout on the host, once per pass, and a mask function reads the layout's tables on the device for the
tiles that are allowed in part (a segment's causal diagonal, a question tree). Plain numpy builds the lists; the
tables are tensors, so a new batch never recompiles the kernel (only a new dtype or a wider range table does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .segments import PAST, SegmentLayout, causal_rows
from .transfer import to_device

# FlexAttention's tile: queries and keys are cut in blocks of this many rows.
BLOCK = 128
# Columns of the range table at least (a segment sees at most a cached prefix and its state: 2 ranges, rarely more).
MIN_RANGES = 4


@functools.cache
def kernel(device_type: str) -> Callable[..., torch.Tensor]:
    """FlexAttention compiled once per process (eager FlexAttention materialises every score: a reference, not a
    kernel). Off CPU with dynamic shapes, so one kernel serves every pass. On CPU with static shapes, a compile per
    shape: inductor's C++ template cannot yet index mask tables whose length is another dynamic size (torch 2.15:
    "cur_qSplitSize5 was not declared"); CPU serving attends with the split kernels, so only tests compile there."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, **compile_options(device_type))


def compile_options(device_type: str) -> dict[str, Any]:
    """`kernel`'s torch.compile options on `device_type` (dynamic shapes off CPU; tests check what they guard)."""
    return {"dynamic": device_type != "cpu"}


@dataclass(frozen=True)
class FlexSegments:
    """One packed pass's layout as a FlexAttention block mask over (query rows, past + pass keys).

    `rows` None: a query row per token of the stream; else the token of each query row (the last layer's kept
    rows, `decoder.SegmentRows`)."""

    block_mask: Any  # torch.nn.attention.flex_attention.BlockMask
    past_length: int
    rows: int  # query rows (the block mask has 2 where there is 1)

    @classmethod
    def of(
        cls, layout: SegmentLayout, past_length: int, device: torch.device, rows: Sequence[int] | None = None
    ) -> FlexSegments:
        """Raises ValueError for a tree segment whose tokens see a later token (the tree engine lays every
        ancestor before its descendants)."""
        from torch.nn.attention.flex_attention import BlockMask

        tokens = layout.tokens
        keys = past_length + tokens
        starts = np.array([segment.start for segment in layout.segments], dtype=np.int64)
        lengths = np.array([len(segment) for segment in layout.segments], dtype=np.int64)
        segment_of = np.repeat(np.arange(len(starts)), lengths)
        ranges = [_key_ranges(segment.past, past_length) for segment in layout.segments]
        # Every table keeps at least 2 entries and the range table at least MIN_RANGES columns, so that one compiled
        # kernel (dynamic shapes specialise sizes 0 and 1) serves every pass: one segment or many, trees or none.
        if len(starts) == 1:
            starts, lengths = np.append(starts, tokens), np.append(lengths, 0)
            ranges.append([])
        own_start = starts + past_length
        width = max(MIN_RANGES, 1 << max(0, max(len(r) for r in ranges) - 1).bit_length())
        low = np.zeros((len(starts), width), dtype=np.int64)
        high = np.zeros((len(starts), width), dtype=np.int64)
        for number, pieces in enumerate(ranges):
            for slot, (start, end) in enumerate(pieces):
                low[number, slot], high[number, slot] = start, end
        trees: list[np.ndarray] = []
        tree_base = np.zeros(len(starts), dtype=np.int64)
        is_tree = np.zeros(len(starts), dtype=bool)
        at = 0
        for number, segment in enumerate(layout.segments):
            if segment.tree is None:
                continue
            causal = causal_rows(len(segment))
            if np.array_equal(segment.tree, causal):
                continue
            if (segment.tree & ~causal).any():
                raise ValueError(f"segment {segment.start}..{segment.end}: a token sees a later token")
            is_tree[number], tree_base[number] = True, at
            trees.append(segment.tree.reshape(-1))
            at += segment.tree.size
        query_tokens = np.arange(tokens) if rows is None else np.asarray(rows, dtype=np.int64)
        query_rows = len(query_tokens)
        if query_rows == 1:  # one kept row: read twice (`attend` returns one)
            query_tokens = np.repeat(query_tokens, 2)
        partial, full = _block_lists(query_tokens, segment_of, starts, own_start, low, high, is_tree, keys)

        def tensor(array: np.ndarray, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return to_device(array, device, dtype)

        mask_mod = _mask_mod(
            query_token=tensor(query_tokens),
            segment_of=tensor(segment_of),
            start=tensor(starts),
            own_start=tensor(own_start),
            tree_base=tensor(tree_base),
            length=tensor(lengths),
            is_tree=tensor(is_tree, torch.bool),
            tree=tensor(np.concatenate(trees) if trees else np.zeros(2, dtype=bool), torch.bool),
            range_low=tensor(low),
            range_high=tensor(high),
        )
        (partial_counts, partial_indices), (full_counts, full_indices) = partial, full
        block_mask = BlockMask.from_kv_blocks(
            tensor(partial_counts)[None, None],
            tensor(partial_indices)[None, None],
            tensor(full_counts)[None, None],
            tensor(full_indices)[None, None],
            BLOCK_SIZE=BLOCK,
            mask_mod=mask_mod,
            seq_lengths=(len(query_tokens), keys),
            compute_q_blocks=False,
        )
        return cls(block_mask, past_length, query_rows)

    def attend(self, query: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor, past: Any) -> torch.Tensor:
        """Attention (heads, rows, head_dim) of `query` (heads, rows, head_dim) over `past` (a `decoder.LayerKV` or
        None) and the pass's own keys/values (kv_heads, tokens, head_dim)."""
        keys, values = new_keys, new_values
        if query.shape[1] == 1:
            query = torch.cat((query, query), dim=1)
        if self.past_length:
            keys = torch.cat((past.keys, keys), dim=1)
            values = torch.cat((past.values, values), dim=1)
        attended = kernel(query.device.type)(
            query.unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            block_mask=self.block_mask,
            scale=query.shape[-1] ** -0.5,
            enable_gqa=query.shape[0] != keys.shape[0],
        )
        return attended[0, :, : self.rows]


def _key_ranges(past: Sequence[Any], past_length: int) -> list[tuple[int, int]]:
    """A segment's past `KeyRange`s in key coordinates (past keys first, then the pass's own), adjacent ones merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(
        (piece.start, piece.end) if piece.source == PAST else (past_length + piece.start, past_length + piece.end)
        for piece in past
    ):
        if merged and merged[-1][1] >= start:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _mask_mod(
    query_token: torch.Tensor,
    segment_of: torch.Tensor,
    start: torch.Tensor,
    own_start: torch.Tensor,
    tree_base: torch.Tensor,
    length: torch.Tensor,
    is_tree: torch.Tensor,
    tree: torch.Tensor,
    range_low: torch.Tensor,
    range_high: torch.Tensor,
) -> Callable[..., torch.Tensor]:
    """Whether query row q may see key k: k in one of its segment's past ranges, or an own key at or before it (in
    a tree segment, one of its ancestors). The tables (s: a segment, t: a token of the stream):
    - `query_token` the token of each query row; `segment_of` (t) its segment;
    - per s: `start` its first token, `own_start` its first own key (key coordinates: past keys first), `length` its
      tokens; `is_tree`, and `tree_base` where its own mask starts in `tree` (tree segments' masks, row-major);
    - `range_low`, `range_high` (s, ranges): the key ranges s sees whole (empty ranges pad the table).

    Only tensors are captured, no number of the batch: a new batch reuses the compiled kernel."""
    width = range_low.shape[1]

    def allowed(batch: torch.Tensor, head: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        token = query_token[q]
        segment = segment_of[token]
        local_query = token - start[segment]
        local_key = k - own_start[segment]
        at = (tree_base[segment] + local_query * length[segment] + local_key).clamp(0, tree.shape[0] - 1)
        seen = (local_key >= 0) & (local_key <= local_query) & (tree[at] | ~is_tree[segment])
        for slot in range(width):
            seen = seen | ((k >= range_low[segment, slot]) & (k < range_high[segment, slot]))
        return seen

    return allowed


def _block_lists(
    query_tokens: np.ndarray,
    segment_of: np.ndarray,
    starts: np.ndarray,
    own_start: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    is_tree: np.ndarray,
    keys: int,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Per block of query rows, the key blocks allowed in part and those allowed whole, as FlexAttention's
    (counts (query blocks,), indices (query blocks, key blocks)) pairs.

    Array work only (a batch of 64 requests has hundreds of query blocks): the rows are grouped into (query block,
    segment) pairs, each pair's key intervals become key-block spans, and the spans of a block's pairs are joined
    (any pair touches the tile) and intersected (every row sees the tile whole)."""
    block = np.arange(len(query_tokens)) // BLOCK
    segment = segment_of[query_tokens]
    order = np.lexsort((query_tokens, segment, block))
    block, segment, token = block[order], segment[order], query_tokens[order]
    heads = np.flatnonzero(np.r_[True, (block[1:] != block[:-1]) | (segment[1:] != segment[:-1])])
    pair_segment = segment[heads]
    first = np.minimum.reduceat(token, heads) - starts[pair_segment]
    last = np.maximum.reduceat(token, heads) - starts[pair_segment]
    own = own_start[pair_segment]
    own_whole_end = np.where(is_tree[pair_segment], own, own + first + 1)  # a tree's own tiles are never whole
    span_low = np.concatenate((low[pair_segment], own[:, None]), axis=1)
    touched = _spans(span_low, np.concatenate((high[pair_segment], (own + last + 1)[:, None]), axis=1), keys, False)
    whole = _spans(span_low, np.concatenate((high[pair_segment], own_whole_end[:, None]), axis=1), keys, True)
    block_heads = np.flatnonzero(np.r_[True, block[heads][1:] != block[heads][:-1]])
    touched = np.logical_or.reduceat(touched, block_heads, axis=0)
    whole = np.logical_and.reduceat(whole, block_heads, axis=0) & touched
    return _listed(touched & ~whole), _listed(whole)


def _spans(low: np.ndarray, high: np.ndarray, keys: int, whole: bool) -> np.ndarray:
    """(pairs, key blocks) booleans: the key blocks each pair's intervals [low, high) touch, or with `whole` lie
    wholly inside one of them (the last block ends at `keys`, however short it is)."""
    key_blocks = -(-keys // BLOCK)
    if whole:
        first = -(-low // BLOCK)
        end = np.where(high >= keys, key_blocks, high // BLOCK)
    else:
        first, end = low // BLOCK, (high - 1) // BLOCK + 1
    pair, slot = np.nonzero((high > low) & (end > first))
    counts = np.zeros((low.shape[0], key_blocks + 1), dtype=np.int32)
    np.add.at(counts, (pair, first[pair, slot]), 1)
    np.add.at(counts, (pair, end[pair, slot]), -1)
    return np.cumsum(counts, axis=1)[:, :key_blocks] > 0


def _listed(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (query blocks, key blocks) boolean table as (counts, indices): each row's chosen blocks first, ascending."""
    return chosen.sum(axis=1), np.argsort(~chosen, axis=1, kind="stable")
