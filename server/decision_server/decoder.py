"""The shard's own decoder for the Llama family and Qwen3: RMSNorm, rotary positions, grouped-query attention
over an arbitrary (tree) mask with torch SDPA, SwiGLU MLP, Qwen3's per-head q/k norms, tied or untied LM head.
Built from tensor-parallel layers, so one implementation serves world size 1..N; each rank loads only its slices."""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from decision_server import fused, layer_graph, step_graphs
from decision_server.checkpoint import Checkpoint
from decision_server.distributed import ShardGroup, partition
from decision_server.flex_segments import FlexSegments
from decision_server.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    amx_row_buckets,
    gemm_rows,
    linear_weight_bytes,
)
from decision_server.segments import NEW, SegmentLayout
from decision_server.transfer import to_device

logger = logging.getLogger(__name__)

# Architectures this decoder implements; others fall back to transformers' modeling at world size 1 only.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
# Rotary types whose frequencies are fixed at load time (dynamic ones rescale with the sequence length).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# The MLP activations of the families above (and the names configs use for them).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class UnsupportedModelError(ValueError):
    """The config asks for something this decoder does not implement; the message says what."""


@dataclass(frozen=True)
class DecoderShape:
    """The facts of a config the decoder needs, checked once."""

    family: str
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    hidden_act: str
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape:
        """Raises `UnsupportedModelError` naming the first thing the decoder cannot run as the config asks."""
        architectures = getattr(config, "architectures", None) or []
        architecture = architectures[0] if architectures else type(config).__name__
        family = ARCHITECTURES.get(architecture)
        if family is None:
            raise UnsupportedModelError(
                f"{architecture} has no tensor-parallel implementation (the shard's own decoder covers "
                f"{', '.join(sorted(ARCHITECTURES))})"
            )
        layer_types = getattr(config, "layer_types", None) or []
        if any(kind != "full_attention" for kind in layer_types) or (
            getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)
        ):
            raise UnsupportedModelError(f"{architecture} with sliding-window layers is not implemented")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type not in STATIC_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {rope_type!r} is not implemented (supported: {', '.join(STATIC_ROPE_TYPES)})"
            )
        hidden_act = str(getattr(config, "hidden_act", "silu"))
        if hidden_act not in ACTIVATIONS:
            raise UnsupportedModelError(f"activation {hidden_act!r} is not implemented")
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        if heads % kv_heads:
            raise UnsupportedModelError(f"{heads} attention heads do not group evenly over {kv_heads} key/value heads")
        hidden = int(config.hidden_size)
        return cls(
            family=family,
            hidden_size=hidden,
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            intermediate_size=int(config.intermediate_size),
            vocab_size=int(config.vocab_size),
            rms_norm_eps=float(config.rms_norm_eps),
            hidden_act=hidden_act,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            attention_bias=bool(getattr(config, "attention_bias", False)),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )

    def check_world_size(self, world_size: int) -> None:
        """Attention splits by key/value head (with its query heads), so there must be one per rank at least."""
        if world_size > self.kv_heads:
            raise UnsupportedModelError(
                f"{self.kv_heads} key/value heads cannot be split over {world_size} ranks; "
                f"use --num-shard {self.kv_heads} or fewer"
            )


class RMSNorm(nn.Module):
    """Normalises in float32 and scales in the compute dtype, like the reference implementations."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # The same operations in one call (bit-equal in float32, tested); faster on strided head views.
            return torch.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return fused.call(_half_norm, x, self.weight, self.eps)


def _half_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of a half-precision `x`: normalised in float32, scaled in `x`'s dtype (a `fused` chain)."""
    wide = x.float()
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


class Rotary(nn.Module):
    """Rotary position embedding ("rotate half" layout of Hugging Face checkpoints) at arbitrary positions."""

    def __init__(self, config: Any, head_dim: int, device: torch.device) -> None:
        super().__init__()
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", "default")
        if rope_type == "default":
            theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
            exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float32)
            inv_freq = 1.0 / (theta ** (exponents / head_dim))
            scaling = 1.0
        else:
            # Scaled variants (linear, llama3, yarn): transformers' own frequency tables for the config.
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, device)
        # A plain attribute, not a buffer: built on its device, never moved or saved.
        self.inv_freq: torch.Tensor = inv_freq.float()
        self.scaling = float(scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, head_dim) cosines and sines for integer `positions` (tokens,)."""
        angles = positions.float().unsqueeze(-1) * self.inv_freq
        doubled = torch.cat((angles, angles), dim=-1)
        return (doubled.cos() * self.scaling).to(dtype), (doubled.sin() * self.scaling).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` (tokens, heads, head_dim) with `cos`/`sin` (tokens, head_dim) ("rotate half").

    The same products and sums as x * cos + rotate_half(x) * sin (bit-equal, tested), written into the two
    halves of one output: no concatenated copy, and on the token-major layout the projections come in.
    """
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    # `cos_sin` repeats its angles over both halves.
    cos, sin = cos[:, None, :half], sin[:, None, :half]
    out = torch.empty_like(x)
    low, high = out[..., :half], out[..., half:]
    torch.mul(first, cos, out=low)
    low.sub_(second * sin)
    torch.mul(second, cos, out=high)
    high.add_(first * sin)
    return out


def _rotate_form(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`_rotate` as the compiler takes it (`fused.call`): the same products and sums, concatenated."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :half], sin[:, None, :half]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def _causal_after_past(query: torch.Tensor, new: LayerKV, past: LayerKV, scale: float) -> torch.Tensor:
    """Causal attention of new tokens (queries `query` (heads, tokens, head_dim), keys/values `new`) that follow
    `past` tokens, on CPU: (heads, tokens, head_dim).

    With a mask over past + new keys, torch's CPU flash kernel computes every query x key block, masked or not,
    and builds the mask; continuing a chain after a long past (a request's state after the chat head other
    requests share, or after a cached prefix) then cost twice the attention of the same chain from position 0.
    Here the past is attended densely and the new tokens causally (the kernel skips the blocks above the
    diagonal), each with its log-sum-exp, and the two softmax parts are merged exactly in float32.

    A past no longer than the new tokens (a short chat head from the prefix cache before a state of its own) is
    instead attended with the new tokens as one causal chain (`_causal_chain`), with no second call and no float32
    merge over every new token, which made a 510-token chain after a 30-token cached head 1.09x slower in bfloat16
    than recomputing the head (bench/results/2026-12-02-c16/head_cache_rates.py).
    """
    if past.keys.shape[1] <= query.shape[1]:
        keys = torch.cat((past.keys, new.keys), dim=1)
        values = torch.cat((past.values, new.values), dim=1)
        return _causal_chain(query, keys, values, scale)
    # One causal block over all new tokens: the tree attention after a past, without a tree.
    return _tree_after_past(query, new, past, TreeAfterPast(((0, query.shape[1], None),)), scale)


# torch's CPU flash kernel computes keys in blocks of 512 for every block of queries, however few of them a causal
# query may see: a chain under about a thousand tokens costs it most of a full square. Chains of more than
# CHAIN_PIECE_TOKENS and at most MAX_PIECED_CHAIN_TOKENS tokens (offset included) are attended another way, by dtype:
# - bfloat16 and float16: in pieces of CHAIN_PIECE_TOKENS queries, each one flash call over the keys up to the
#   piece's end (those before it densely, its own square by a mask), so about half the products are computed. One
#   layer's chain (Qwen3-0.6B's heads, 2 Zen 4 cores): 540 tokens 1.24x faster, 300-1,024 tokens 1.11-1.24x, 1,536
#   a tie (bench/results/2026-12-05-zen4/masked_pieces.txt); a whole bfloat16 tree read 1.020-1.022x (pieces_ab.txt).
#   No log-sum-exp merge: each piece is a whole softmax.
# - float32: the same pieces were 1.21x faster alone but 0.986-0.993x inside a read. There the kernel's own float32
#   blocks are the slow part: batched float32 GEMMs over blocks of CHAIN_GEMM_ROWS queries with an exact softmax
#   between them (`_gemm_chain`) ran a chain of 540 tokens 1.38x and 860 tokens 1.16x faster alone, errors as small
#   (gemm_attention.txt), and a whole float32 tree read 1.031x (gemm_chain_ab.txt).
#   That pays only where the products are heavy: `_gemm_chain` is about 18 ops per block of CHAIN_GEMM_ROWS queries
#   (144 per layer for 512 tokens), and on queries narrower than GEMM_CHAIN_MIN_WIDTH (heads x head_dim) one flash
#   call was as fast or faster (1 thread, 512-860 tokens: width 64 0.68-0.78x the time, width 128 0.76-0.94x,
#   width 576 0.82-0.94x, width 2048 0.91-1.00x, on a machine busy with builds:
#   bench/results/2026-12-06-layer-graph/chain_kernels.py). Narrower queries (no served model has them; the
#   host-overhead proxy's deep, narrow model does) take one flash call; wider ones keep the GEMM blocks, on the quiet
#   2-thread Zen 4 measurement above (not re-measured quiet here).
# Longer chains stay one flash call.
CHAIN_PIECE_TOKENS = 192
GEMM_CHAIN_MIN_WIDTH = 512
MAX_PIECED_CHAIN_TOKENS = 1024
CHAIN_GEMM_ROWS = 64


def _chain_pieces(tokens: int, offset: int) -> list[tuple[int, int]]:
    """The pieces (start, end) of `tokens` queries at positions offset .. offset + tokens - 1 that `_causal_chain`
    attends one flash call each in bfloat16 and float16: one piece where pieces do not pay (a chain of at most
    CHAIN_PIECE_TOKENS tokens, or one past MAX_PIECED_CHAIN_TOKENS)."""
    if tokens <= CHAIN_PIECE_TOKENS or offset + tokens > MAX_PIECED_CHAIN_TOKENS:
        return [(0, tokens)]
    return [(start, min(start + CHAIN_PIECE_TOKENS, tokens)) for start in range(0, tokens, CHAIN_PIECE_TOKENS)]


def _causal_chain(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention on CPU of `query` (heads, tokens, head_dim) at the last `tokens` positions of `keys` and
    `values` (kv_heads, offset + tokens, head_dim): query i sees keys 0 .. offset + i. (heads, tokens, head_dim).

    In pieces (`_chain_pieces`): in float32 by `_gemm_chain`; otherwise a piece from position 0 is the kernel's own
    causal call and any other sees the keys up to its end through an additive mask (`_piece_mask`). One piece after
    an offset is one causal call over queries padded at the front with a zero row per offset token, so query i sits
    at position offset + i; the padding rows cost offset²/2 products that nobody reads.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    tokens, offset = query.shape[1], keys.shape[1] - query.shape[1]
    q, k, v = query.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0)
    pieces = _chain_pieces(tokens, offset)
    if len(pieces) > 1 and query.dtype == torch.float32:
        if query.shape[0] * query.shape[2] >= GEMM_CHAIN_MIN_WIDTH:
            return _gemm_chain(query, keys, values, scale)
        pieces = [(0, tokens)]
    if len(pieces) == 1 and offset:
        padded = torch.cat((q.new_zeros(1, q.shape[1], offset, q.shape[3]), q), dim=2)
        return flash(padded, k, v, 0.0, True, scale=scale)[0][0, :, offset:]
    parts = []
    for start, end in pieces:
        seen = offset + end
        if offset + start == 0:
            parts.append(flash(q[:, :, :end], k[:, :, :end], v[:, :, :end], 0.0, True, scale=scale)[0][0])
        else:
            mask = _piece_mask(end - start, seen, query.dtype)
            attended = flash(
                q[:, :, start:end], k[:, :, :seen], v[:, :, :seen], 0.0, False, attn_mask=mask, scale=scale
            )
            parts.append(attended[0][0])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _gemm_chain(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """`_causal_chain` in float32 as batched GEMMs: per block of CHAIN_GEMM_ROWS queries, the scores of a key/value
    head's query heads over the keys up to the block's end (one `bmm`), the block's own square masked above its
    diagonal, an exact softmax (max, exp, sum in float32) and one `bmm` with the values."""
    heads, tokens, width = query.shape
    kv_heads, length, _ = keys.shape
    group, offset = heads // kv_heads, length - tokens
    scaled = (query * scale).view(kv_heads, group, tokens, width)
    keys_t = keys.transpose(1, 2)
    out = query.new_empty(kv_heads, group, tokens, width)
    above = torch.ones(CHAIN_GEMM_ROWS, CHAIN_GEMM_ROWS, dtype=torch.bool).triu_(1)
    for start in range(0, tokens, CHAIN_GEMM_ROWS):
        end = min(tokens, start + CHAIN_GEMM_ROWS)
        rows, seen = end - start, offset + end
        scores = torch.bmm(scaled[:, :, start:end].reshape(kv_heads, group * rows, width), keys_t[:, :, :seen])
        scores.view(kv_heads, group, rows, seen)[..., offset + start :].masked_fill_(above[:rows, :rows], float("-inf"))
        weights = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
        total = weights.sum(-1, keepdim=True)
        out[:, :, start:end] = torch.bmm(weights, values[:, :seen]).div_(total).view(kv_heads, group, rows, width)
    return out.view(heads, tokens, width)


@functools.lru_cache(maxsize=16)
def _piece_mask(rows: int, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask (1, 1, rows, keys) of a chain's last `rows` queries over its first `keys` keys: row r sees
    keys 0 .. keys - rows + r. Cached: a pass's layers all ask for the same few (never written to)."""
    allowed = torch.ones(rows, keys, dtype=torch.bool).tril_(keys - rows)
    return torch.zeros(rows, keys, dtype=dtype).masked_fill_(~allowed, float("-inf"))[None, None]


# Blocks of a tree pass smaller than this are attended together (one kernel call over their block-diagonal mask):
# a call per tiny branch would cost more in dispatch than the masked-out products it saves.
MIN_TREE_BLOCK_TOKENS = 128


# A causal chain at the start of a masked pass is attended apart from the tree after it (`TreeAfterPast.lead`) only
# from this length on; a shorter one rides the first block of the tree, as a short chain in a branch pass always did.
MIN_LEAD_TOKENS = 32


@dataclass(frozen=True)
class TreeAfterPast:
    """The mask of a pass whose tokens all see every past token and, among themselves, their tree ancestors (the
    branches pass of a tree read: questions and labels after their shared state), cut into independent blocks.

    A dense mask over past + new keys makes the CPU kernel compute every query x key product, so 32 questions of
    40 tokens after a 560-token state cost 1,280 x 1,840 products per head where 1,280 x 560 + 32 x 40 x 40 are
    needed. Here the past is attended densely without a mask, and the new tokens block by block: `blocks` are
    (start, end, mask) over the new tokens after the lead, no token attending outside its block, `mask` None where
    the block is a plain causal chain. The parts are merged exactly by their log-sum-exp.

    `lead`: the pass's first tokens form a causal chain that every later token sees whole (a tree segment that
    starts with a chain shorter than the engine's `min_chain_tokens` but at least MIN_LEAD_TOKENS long). The lead is
    attended causally after the past, and the tokens after it see past + lead as their past. 0 when there is none,
    or it is shorter than MIN_LEAD_TOKENS.
    """

    blocks: tuple[tuple[int, int, torch.Tensor | None], ...]
    lead: int = 0

    @classmethod
    def of(cls, mask: torch.Tensor, past_length: int, dtype: torch.dtype) -> TreeAfterPast | None:
        """The split form of `mask` ((1, 1, tokens, past + tokens) booleans), or None where it has another shape:
        some token does not see the whole past, or there is neither a past nor a lead. Block masks are additive,
        in `dtype` (the CPU kernel takes a mask in the queries' dtype)."""
        if mask.dtype != torch.bool or mask.shape[0] != 1 or mask.shape[1] != 1:
            return None
        allowed = mask[0, 0]
        if not bool(allowed[:, :past_length].all()):
            return None
        return cls.of_own(allowed[:, past_length:], past_length, dtype)

    @classmethod
    def of_own(cls, own: torch.Tensor, past_length: int, dtype: torch.dtype) -> TreeAfterPast | None:
        """The split form of a pass whose tokens all see `past_length` past keys, with `own` ((tokens, tokens)
        booleans) among themselves; None where there is neither a past nor a lead."""
        lead = _lead_chain(own)
        if lead < MIN_LEAD_TOKENS:
            lead = 0
        if past_length == 0 and lead == 0:
            return None
        own = own[lead:, lead:]
        tokens = own.shape[0]
        if tokens == 0:
            return cls((), lead)
        # A token attends only itself and earlier tokens (its ancestors); a block ends before `b` when no token
        # from `b` on attends anything before `b`.
        first = torch.where(own.any(dim=1), own.int().argmax(dim=1), torch.arange(tokens))
        reach = torch.flip(torch.cummin(torch.flip(first, (0,)), dim=0).values, (0,))
        starts = torch.nonzero(reach == torch.arange(tokens)).flatten().tolist()  # always holds 0
        bounds = list(zip(starts, [*starts[1:], tokens], strict=True))
        grouped: list[tuple[int, int]] = []
        for start, end in bounds:
            if grouped and grouped[-1][1] - grouped[-1][0] < MIN_TREE_BLOCK_TOKENS:
                grouped[-1] = (grouped[-1][0], end)
            else:
                grouped.append((start, end))
        blocks = []
        for start, end in grouped:
            block = own[start:end, start:end]
            causal = bool(torch.equal(block, torch.ones_like(block).tril()))
            additive = torch.zeros(block.shape, dtype=dtype).masked_fill_(~block, float("-inf"))
            blocks.append((start, end, None if causal else additive[None, None]))
        return cls(tuple(blocks), lead)


def _lead_chain(own: torch.Tensor) -> int:
    """The length of the causal chain that starts `own` ((tokens, tokens) booleans among a pass's tokens): its
    tokens see exactly the chain's earlier tokens and themselves, and every later token sees all of it."""
    tokens = own.shape[0]
    causal_rows = (own == torch.ones_like(own).tril()).all(dim=1)
    chain = tokens if bool(causal_rows.all()) else int(causal_rows.int().argmin())
    if chain == tokens:
        return tokens
    # The later tokens must see the whole chain: shorten it to the columns all of them see.
    seen = own[chain:, :chain].all(dim=0)
    return chain if bool(seen.all()) else int(seen.int().argmin())


def _tree_after_past(
    query: torch.Tensor, new: LayerKV, past: LayerKV | None, tree: TreeAfterPast, scale: float
) -> torch.Tensor:
    """Attention of a `TreeAfterPast` pass on CPU: (heads, tokens, head_dim)."""
    if tree.lead:
        lead = tree.lead
        chain = LayerKV(new.keys[:, :lead], new.values[:, :lead])
        if past is not None and past.keys.shape[1]:
            led = _causal_after_past(query[:, :lead], chain, past, scale)
            seen = LayerKV(torch.cat((past.keys, chain.keys), dim=1), torch.cat((past.values, chain.values), dim=1))
        else:
            led = _causal_chain(query[:, :lead], chain.keys, chain.values, scale)
            seen = chain
        if lead == query.shape[1]:
            return led
        rest = LayerKV(new.keys[:, lead:], new.values[:, lead:])
        after = _tree_after_past(query[:, lead:], rest, seen, TreeAfterPast(tree.blocks), scale)
        return torch.cat((led, after), dim=1)
    assert past is not None  # TreeAfterPast.of splits a pass without a past only at a lead
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q = query.unsqueeze(0)
    # The kernel reads grouped key/value heads in place (query head h uses key/value head h // group).
    old, old_lse = flash(q, past.keys.unsqueeze(0), past.values.unsqueeze(0), 0.0, False, scale=scale)[:2]
    parts, lses = [], []
    for start, end, mask in tree.blocks:
        keys, values = new.keys[:, start:end].unsqueeze(0), new.values[:, start:end].unsqueeze(0)
        part, lse = flash(q[:, :, start:end], keys, values, 0.0, mask is None, attn_mask=mask, scale=scale)[:2]
        parts.append(part)
        lses.append(lse)
    own = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    own_lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=2)
    # Each part is normalised over its own keys; weights exp(lse - max) renormalise them exactly, in float32.
    top = torch.maximum(old_lse, own_lse)
    old_weight = torch.exp(old_lse - top).unsqueeze(-1)
    own_weight = torch.exp(own_lse - top).unsqueeze(-1)
    merged = (old.float() * old_weight + own.float() * own_weight) / (old_weight + own_weight)
    return merged[0].to(query.dtype)


@dataclass(frozen=True)
class KeptRows:
    """The rows of a pass whose hidden states are read (their next-token scores), for the last layer, which
    computes only those: the other tokens need nothing from it but their keys/values. On a tree read that skips
    the last layer's queries, attention output and MLP for most tokens (about 1/layers of the pass).

    `index` (rows,) token indices; `mask` (1, 1, rows, past + tokens) booleans, what each row may attend.
    """

    index: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def of(
        cls, keep: torch.Tensor, mask: torch.Tensor | None, past_length: int, tokens: int, bucket: bool = False
    ) -> KeptRows:
        """`mask` as `DecoderLM.hidden_states` takes it (None = causal after the past). With `bucket`, the last kept
        row repeats up to `gemm_rows` rows (callers read the first len(keep))."""
        if bucket and keep.numel():
            keep = torch.cat((keep, keep[-1:].expand(gemm_rows(len(keep)) - len(keep))))
        if mask is not None:
            return cls(keep, mask.index_select(2, keep))
        keys = torch.arange(past_length + tokens, device=keep.device)
        return cls(keep, (keys <= (keep + past_length).unsqueeze(-1))[None, None])


@dataclass(frozen=True)
class _SegmentRun:
    """One segment of a packed pass as the kernels take it: `past` its key ranges; on CPU a tree segment is split
    like a branches pass (`split`), else attended with `mask` ((1, 1, n, past + n) booleans) in one call; a causal
    segment (`causal`) needs no mask on CPU and none without a past elsewhere."""

    start: int
    end: int
    past: tuple[tuple[bool, int, int], ...]  # (from the pass's own new keys, start, end)
    causal: bool
    split: TreeAfterPast | None
    mask: torch.Tensor | None


# How a packed pass attends its segments (`SegmentPlan`): "split", the CPU kernels the decoder splits passes into;
# "sdpa", one SDPA call per segment; "flex", one FlexAttention call per layer for all segments (`flex_segments`).
SEGMENT_KERNELS = ("split", "sdpa", "flex")


@dataclass(frozen=True)
class SegmentPlan:
    """A `segments.SegmentLayout` ready for one pass's layers: every segment attended on its own keys (no product
    between unrelated requests is ever computed), each layer's output in stream order.

    `kernel` (SEGMENT_KERNELS): on CPU the segments use the kernels the decoder already splits passes into
    (`_causal_chain`, `_causal_after_past`, `_tree_after_past`); off CPU one FlexAttention call per layer whose block
    mask skips every tile between requests (`flex_segments`; `DecoderModel.choose_segment_kernel` probes it at load),
    or one SDPA call per segment with its own mask, over its past and its own keys only. All compute the same
    attention, and the tests run each on CPU."""

    runs: tuple[_SegmentRun, ...]
    kernel: str
    past_length: int
    flex: FlexSegments | None

    @property
    def split_kernels(self) -> bool:
        return self.kernel == "split"

    @classmethod
    def of(
        cls, layout: SegmentLayout, past_length: int, dtype: torch.dtype, device: torch.device, kernel: str = "split"
    ) -> SegmentPlan:
        if kernel not in SEGMENT_KERNELS:
            raise ValueError(f"segment kernel must be one of {', '.join(SEGMENT_KERNELS)}, got {kernel!r}")
        if kernel == "split" and device.type != "cpu":
            raise ValueError(f"the split segment kernels run on CPU only, not on {device.type}")
        layout.check(past_length)
        split_kernels = kernel == "split"
        runs = []
        for segment in layout.segments:
            seen = segment.past_length
            past = tuple((piece.source == NEW, piece.start, piece.end) for piece in segment.past)
            if kernel == "flex":
                runs.append(_SegmentRun(segment.start, segment.end, past, segment.tree is None, None, None))
                continue
            tree = None if segment.tree is None else torch.from_numpy(segment.tree)
            causal = tree is None or bool(torch.equal(tree, torch.ones_like(tree).tril()))
            split = None
            if split_kernels and tree is not None and not causal:
                split = TreeAfterPast.of_own(tree, seen, dtype)
            mask = None
            if not (causal and (split_kernels or not seen)) and split is None:
                own = torch.from_numpy(segment.own_allowed())
                allowed = torch.cat((torch.ones(len(segment), seen, dtype=torch.bool), own), dim=1)
                mask = to_device(allowed, device, torch.bool)[None, None]
            runs.append(_SegmentRun(segment.start, segment.end, past, causal, split, mask))
        flex = FlexSegments.of(layout, past_length, device) if kernel == "flex" else None
        return cls(tuple(runs), kernel, past_length, flex)

    @staticmethod
    def past_of(run: _SegmentRun, past: LayerKV | None, new: LayerKV) -> LayerKV | None:
        """The keys/values `run` sees whole, in its ranges' order (views where there is one range)."""
        keys, values = [], []
        for from_new, start, end in run.past:
            source = new if from_new else past
            if source is None:
                raise ValueError("a segment sees past keys the pass was not given")
            keys.append(source.keys[:, start:end])
            values.append(source.values[:, start:end])
        if not keys:
            return None
        if len(keys) == 1:
            return LayerKV(keys[0], values[0])
        return LayerKV(torch.cat(keys, dim=1), torch.cat(values, dim=1))

    def attend(self, query: torch.Tensor, new: LayerKV, past: LayerKV | None, scale: float) -> torch.Tensor:
        """Attention of every token of the pass, (heads, tokens, head_dim), segment by segment."""
        if self.flex is not None:
            return self.flex.attend(query, new.keys, new.values, past)
        parts = []
        for run in self.runs:
            q = query[:, run.start : run.end]
            own = LayerKV(new.keys[:, run.start : run.end], new.values[:, run.start : run.end])
            seen = self.past_of(run, past, new)
            if run.split is not None:
                parts.append(_tree_after_past(q, own, seen, run.split, scale))
            elif self.split_kernels and run.causal and seen is not None:
                parts.append(_causal_after_past(q, own, seen, scale))
            elif self.split_kernels and run.causal:
                parts.append(_causal_chain(q, own.keys, own.values, scale))
            else:
                parts.append(_dense_attention(q, own, seen, run.mask, scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _dense_attention(
    query: torch.Tensor, own: LayerKV, seen: LayerKV | None, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """One SDPA call of `query` over `seen` + `own` keys with a boolean `mask` (None: causal, without a past)."""
    keys, values = own.keys, own.values
    if seen is not None:
        keys, values = torch.cat((seen.keys, keys), dim=1), torch.cat((seen.values, values), dim=1)
    attended = F.scaled_dot_product_attention(
        query.unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None and query.shape[1] > 1,
        scale=scale,
        enable_gqa=query.shape[0] != keys.shape[0],
    )
    return attended[0]


@dataclass(frozen=True)
class SegmentRows:
    """`KeptRows` of a packed pass: the last layer computes only the kept rows, each over its own segment's keys.

    `index` (rows,) token indices as `KeptRows.index` (bucket padding included); per segment, the positions in
    `index` of its rows, their indices inside the segment and their mask over the segment's past + own keys."""

    index: torch.Tensor
    plan: SegmentPlan
    groups: tuple[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor], ...]  # (run, slots, local rows, mask)
    flex: FlexSegments | None = None  # the plan's FlexAttention block mask for these rows (then no `groups`)

    @classmethod
    def of(
        cls, keep: Sequence[int], plan: SegmentPlan, layout: SegmentLayout, device: torch.device, bucket: bool = False
    ) -> SegmentRows:
        """`keep` the kept token indices (a host list: grouping them by segment needs no device round trip)."""
        wanted = list(keep)
        if bucket and wanted:
            wanted += wanted[-1:] * (gemm_rows(len(wanted)) - len(wanted))
        index = to_device(wanted, device, torch.long)
        if plan.flex is not None:
            return cls(
                index, plan, (), FlexSegments.of(layout, plan.past_length, device, rows=wanted) if wanted else None
            )
        starts = [run.start for run in plan.runs]
        slots_of: dict[int, list[int]] = {}
        for slot, token in enumerate(wanted):
            slots_of.setdefault(bisect.bisect_right(starts, token) - 1, []).append(slot)
        groups = []
        for number, slots in sorted(slots_of.items()):
            run, segment = plan.runs[number], layout.segments[number]
            local = [wanted[slot] - run.start for slot in slots]
            own = torch.from_numpy(segment.own_rows(local))
            mask = torch.cat((torch.ones(len(local), segment.past_length, dtype=torch.bool), own), dim=1)
            groups.append(
                (
                    number,
                    to_device(slots, device, torch.long),
                    to_device(local, device, torch.long),
                    to_device(mask, device, torch.bool)[None, None],
                )
            )
        return cls(index, plan, tuple(groups))

    def attend(self, query: torch.Tensor, new: LayerKV, past: LayerKV | None, scale: float) -> torch.Tensor:
        """Attention output of the kept rows, (heads, rows, head_dim) in `index` order."""
        if self.flex is not None:
            return self.flex.attend(query.index_select(1, self.index), new.keys, new.values, past)
        out = query.new_empty(query.shape[0], self.index.shape[0], query.shape[2])
        for number, slots, local, mask in self.groups:
            run = self.plan.runs[number]
            own = LayerKV(new.keys[:, run.start : run.end], new.values[:, run.start : run.end])
            q = query[:, run.start : run.end].index_select(1, local)
            out.index_copy_(1, slots, _dense_attention(q, own, self.plan.past_of(run, past, new), mask, scale))
        return out


@dataclass
class LayerKV:
    keys: torch.Tensor  # (kv_heads_here, tokens, head_dim), positions already applied
    values: torch.Tensor


class Attention(nn.Module):
    """Grouped-query attention over this rank's key/value heads and their query heads."""

    def __init__(
        self,
        qkv: ColumnParallelLinear,
        out: RowParallelLinear,
        heads: int,
        kv_heads: int,
        head_dim: int,
        q_norm: RMSNorm | None,
        k_norm: RMSNorm | None,
    ) -> None:
        super().__init__()
        self.qkv = qkv
        self.out = out
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.q_norm = q_norm
        self.k_norm = k_norm

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | TreeAfterPast | SegmentPlan | None,
        past: LayerKV | None,
        rows: KeptRows | SegmentRows | None = None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """Attention output of every token, or with `rows` of those rows only (keys/values are of every token).

        `hidden` may end in padding rows past the pass's tokens (`cos` has a row per token: `DecoderLM.hidden_states`):
        they go through the projections, and the output has them as zeros; attention and keys/values never see them.
        """
        query, new = self.project(hidden, cos, sin)
        attended = self.attend(query, new, mask, past, rows, hidden.shape[0])
        if attended is None:
            return hidden[:0], new  # no query at all: the layer only adds its keys/values
        return self.out(attended), new

    def project(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, LayerKV]:
        """Queries (heads, tokens, head_dim) and keys/values (kv_heads, tokens, head_dim) of the pass's tokens,
        norms and positions applied (what `layer_graph` computes compiled)."""
        tokens = cos.shape[0]
        packed = self.qkv(hidden)
        if hidden.shape[0] > tokens:
            packed = packed[:tokens]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        query = packed[:, :q_size].view(tokens, self.heads, self.head_dim)
        key = packed[:, q_size : q_size + kv_size].view(tokens, self.kv_heads, self.head_dim)
        value = packed[:, q_size + kv_size :].view(tokens, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        # (heads, tokens, head_dim) from here on.
        query = fused.call(_rotate, query, cos, sin, form=_rotate_form).transpose(0, 1)
        key = fused.call(_rotate, key, cos, sin, form=_rotate_form).transpose(0, 1)
        return query, LayerKV(key, value.transpose(0, 1))

    def attend(
        self,
        query: torch.Tensor,
        new: LayerKV,
        mask: torch.Tensor | TreeAfterPast | SegmentPlan | None,
        past: LayerKV | None,
        rows: KeptRows | SegmentRows | None,
        run_rows: int,
    ) -> torch.Tensor | None:
        """Attention of `query` over `past` and `new`, token-major (run_rows, heads * head_dim) as the output
        projection takes it (with `rows`: those rows only; None where there is no row at all)."""
        tokens, scale = query.shape[1], self.head_dim**-0.5
        key, value = new.keys, new.values
        if rows is not None:
            if not rows.index.numel():
                return None
            if isinstance(rows, SegmentRows):
                attended = rows.attend(query, new, past, scale)
                return _token_major(attended, attended.shape[1])
            return self._rows_only(query, new, past, rows)
        if isinstance(mask, SegmentPlan):
            return _token_major(mask.attend(query, new, past, scale), run_rows)
        if isinstance(mask, TreeAfterPast):
            return _token_major(_tree_after_past(query, new, past, mask, scale), run_rows)
        if mask is None and tokens > 1 and query.device.type == "cpu":
            # No tree: causal attention from position 0 or continuing after the past tokens, in the kernel's causal
            # calls (see _causal_chain and _causal_after_past).
            if past is not None and past.keys.shape[1]:
                attended = _causal_after_past(query, new, past, scale)
            else:
                attended = _causal_chain(query, key, value, scale)
            return _token_major(attended, run_rows)
        if past is not None:
            key = torch.cat((past.keys, key), dim=1)
            value = torch.cat((past.values, value), dim=1)
        causal = mask is None and tokens > 1
        if mask is None and past is not None and tokens > 1:
            # No tree: plain causal attention continuing after the past tokens.
            past_length = past.keys.shape[1]
            query_positions = torch.arange(tokens, device=query.device).unsqueeze(-1) + past_length
            mask = query_positions >= torch.arange(past_length + tokens, device=query.device)
            mask, causal = mask[None, None], False
        attended = F.scaled_dot_product_attention(
            query.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            # Each key/value head serves heads // kv_heads consecutive query heads; SDPA reads them in place
            # (copying them out per layer cost about 6 % of causal attention, measured).
            enable_gqa=self.heads != self.kv_heads,
        )
        return _token_major(attended[0], run_rows)

    def _rows_only(self, query: torch.Tensor, new: LayerKV, past: LayerKV | None, rows: KeptRows) -> torch.Tensor:
        """Attention output (rows, heads * head_dim) of the kept rows' queries over every key they may see."""
        if past is not None and past.keys.shape[1]:
            keys = torch.cat((past.keys, new.keys), dim=1)
            values = torch.cat((past.values, new.values), dim=1)
        else:
            keys, values = new.keys, new.values
        attended = F.scaled_dot_product_attention(
            query.index_select(1, rows.index).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=rows.mask,
            scale=self.head_dim**-0.5,
            enable_gqa=self.heads != self.kv_heads,
        )
        return _token_major(attended[0], rows.index.shape[0])


def _token_major(attended: torch.Tensor, rows: int) -> torch.Tensor:
    """Attention output (heads, tokens, head_dim) as `rows` >= tokens token-major rows (rows, heads * head_dim) for
    the output projection, the rows past `tokens` (a pass's padding) zeros."""
    heads, tokens, head_dim = attended.shape
    if rows == tokens:
        return attended.transpose(0, 1).reshape(tokens, heads * head_dim)
    merged = attended.new_empty(rows, heads * head_dim)
    merged[:tokens].view(tokens, heads, head_dim).copy_(attended.transpose(0, 1))
    merged[tokens:].zero_()
    return merged


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up are column-parallel (fused), down row-parallel."""

    def __init__(self, gate_up: ColumnParallelLinear, down: RowParallelLinear, act: Callable[..., Any]) -> None:
        super().__init__()
        self.gate_up = gate_up
        self.down = down
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected: torch.Tensor = self.down(fused.call(_gated, self.gate_up(x), self.act))
        return projected


def _gated(gate_up: torch.Tensor, act: Callable[..., torch.Tensor]) -> torch.Tensor:
    """act(gate) * up of the fused gate/up projection's output (a `fused` chain)."""
    gate, up = gate_up.chunk(2, dim=-1)
    activated: torch.Tensor = act(gate)
    return activated.mul_(up)


class DecoderLayer(nn.Module):
    def __init__(self, attention: Attention, mlp: GatedMLP, input_norm: RMSNorm, post_attention_norm: RMSNorm) -> None:
        super().__init__()
        self.attention = attention
        self.mlp = mlp
        self.input_norm = input_norm
        self.post_attention_norm = post_attention_norm

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | TreeAfterPast | SegmentPlan | None,
        past: LayerKV | None,
        rows: KeptRows | SegmentRows | None = None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """The layer's output for every token, or with `rows` for those rows only (keys/values of every token)."""
        attended, new = self.attention(self.input_norm(hidden), cos, sin, mask, past, rows)
        if rows is not None:
            hidden = hidden.index_select(0, rows.index)
            if not rows.index.numel():
                return hidden, new
        return self.finish(hidden, attended), new

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after this layer, from its input `hidden` and its projected attention output."""
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_norm(hidden))

    def weights(self) -> layer_graph.LayerWeights:
        """This layer's tensors as `layer_graph` takes them (packed or split weights by their slot)."""
        q_norm, k_norm = self.attention.q_norm, self.attention.k_norm
        return layer_graph.LayerWeights(
            input_norm=self.input_norm.weight,
            qkv=layer_graph.hold(self.attention.qkv.weight),
            qkv_bias=self.attention.qkv.bias,
            q_norm=None if q_norm is None else q_norm.weight,
            k_norm=None if k_norm is None else k_norm.weight,
            out=layer_graph.hold(self.attention.out.weight),
            out_bias=self.attention.out.bias,
            post_norm=self.post_attention_norm.weight,
            gate_up=layer_graph.hold(self.mlp.gate_up.weight),
            gate_up_bias=self.mlp.gate_up.bias,
            down=layer_graph.hold(self.mlp.down.weight),
            down_bias=self.mlp.down.bias,
        )


@dataclass(frozen=True)
class RankShare:
    """What this rank owns: key/value heads (with their query heads), MLP features and vocabulary rows."""

    kv_heads: tuple[int, int]
    heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]
    embedding: tuple[int, int]

    @classmethod
    def of(cls, shape: DecoderShape, embedding_rows: int, group: ShardGroup) -> RankShare:
        rank, world = group.rank, group.world_size
        kv_start, kv_end = partition(shape.kv_heads, world, rank)
        per_group = shape.heads // shape.kv_heads
        vocab = partition(shape.vocab_size, world, rank)
        return cls(
            kv_heads=(kv_start, kv_end),
            heads=(kv_start * per_group, kv_end * per_group),
            intermediate=partition(shape.intermediate_size, world, rank),
            vocab=vocab,
            # Tied weights are one tensor: the embedding is split exactly like the head.
            embedding=vocab if shape.tie_word_embeddings else partition(embedding_rows, world, rank),
        )


class DecoderLM(nn.Module):
    """Embedding, decoder layers, final norm and LM head of one rank."""

    def __init__(
        self,
        shape: DecoderShape,
        share: RankShare,
        embedding: VocabParallelEmbedding,
        layers: list[DecoderLayer],
        norm: RMSNorm,
        head: ParallelLMHead,
        rotary: Rotary,
    ) -> None:
        super().__init__()
        self.shape = shape
        self.share = share
        self.embedding = embedding
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.head = head
        self.rotary = rotary
        # Passes run their GEMMs at bucketed row counts where oneDNN's AMX kernels are built per count (ROW_BUCKET).
        self.bucket_rows = amx_row_buckets(self)
        # The layers between attentions as compiled graphs (`compile_layers`), or None: eager.
        self.graph: layer_graph.LayerGraph | None = None
        # Those graphs replayed as CUDA graphs per token-count bucket (`capture_graphs`), or None.
        self.step_graphs: step_graphs.StepGraphs | None = None

    @classmethod
    def load(
        cls,
        checkpoint: Checkpoint,
        config: Any,
        group: ShardGroup,
        dtype: torch.dtype,
        device: torch.device,
        matmul: str = "exact",
    ) -> DecoderLM:
        """Builds this rank's part of the model, reading only its slices of each checkpoint tensor; `matmul` is
        how float32 linears multiply (`layers.MATMUL_MODES`)."""
        shape = DecoderShape.from_config(config)
        shape.check_world_size(group.world_size)
        embedding_name = "model.embed_tokens.weight"
        embedding_rows = checkpoint.shape(embedding_name)[0]
        share = RankShare.of(shape, embedding_rows, group)
        checkpoint.expect_shape(embedding_name, [embedding_rows, shape.hidden_size])

        def read(name: str, dim: int | None = None, span: tuple[int, int] = (0, 0)) -> torch.Tensor:
            if dim is None:
                return checkpoint.read(name, dtype, device)
            return checkpoint.read(name, dtype, device, dim=dim, start=span[0], end=span[1])

        hd = shape.head_dim
        q_rows = (share.heads[0] * hd, share.heads[1] * hd)
        kv_rows = (share.kv_heads[0] * hd, share.kv_heads[1] * hd)
        heads_here = share.heads[1] - share.heads[0]
        kv_here = share.kv_heads[1] - share.kv_heads[0]
        act = ACTIVATIONS[shape.hidden_act]
        layers = []
        for index in range(shape.layers):
            prefix = f"model.layers.{index}."
            attn = prefix + "self_attn."
            checkpoint.expect_shape(attn + "q_proj.weight", [shape.heads * hd, shape.hidden_size])
            checkpoint.expect_shape(attn + "k_proj.weight", [shape.kv_heads * hd, shape.hidden_size])
            qkv = ColumnParallelLinear.load(
                checkpoint,
                [attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"],
                [q_rows, kv_rows, kv_rows],
                dtype,
                device,
                bias=shape.attention_bias,
                matmul=matmul,
            )
            out = RowParallelLinear.load(
                checkpoint,
                attn + "o_proj.weight",
                q_rows,
                group,
                dtype,
                device,
                bias=shape.attention_bias,
                matmul=matmul,
            )
            q_norm = k_norm = None
            if shape.qk_norm:
                q_norm = RMSNorm(read(attn + "q_norm.weight"), shape.rms_norm_eps)
                k_norm = RMSNorm(read(attn + "k_norm.weight"), shape.rms_norm_eps)
            mlp = prefix + "mlp."
            checkpoint.expect_shape(mlp + "gate_proj.weight", [shape.intermediate_size, shape.hidden_size])
            gate_up = ColumnParallelLinear.load(
                checkpoint,
                [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
                [share.intermediate, share.intermediate],
                dtype,
                device,
                bias=shape.mlp_bias,
                matmul=matmul,
            )
            down = RowParallelLinear.load(
                checkpoint,
                mlp + "down_proj.weight",
                share.intermediate,
                group,
                dtype,
                device,
                bias=shape.mlp_bias,
                matmul=matmul,
            )
            layers.append(
                DecoderLayer(
                    Attention(qkv, out, heads_here, kv_here, hd, q_norm, k_norm),
                    GatedMLP(gate_up, down, act),
                    RMSNorm(read(prefix + "input_layernorm.weight"), shape.rms_norm_eps),
                    RMSNorm(read(prefix + "post_attention_layernorm.weight"), shape.rms_norm_eps),
                )
            )
        embedding = VocabParallelEmbedding(
            read(embedding_name, 0, share.embedding), share.embedding[0], embedding_rows, group
        )
        if not shape.tie_word_embeddings and not checkpoint.has("lm_head.weight"):
            raise UnsupportedModelError(f"{checkpoint.folder}: untied embeddings but no lm_head.weight")
        if shape.tie_word_embeddings:
            if embedding_rows != shape.vocab_size or share.embedding != share.vocab:
                raise UnsupportedModelError(
                    f"tied LM head over {embedding_rows} embedding rows but vocab_size {shape.vocab_size}"
                )
            head = ParallelLMHead(embedding.weight, share.vocab[0], shape.vocab_size, group)
        else:
            checkpoint.expect_shape("lm_head.weight", [shape.vocab_size, shape.hidden_size])
            head = ParallelLMHead(read("lm_head.weight", 0, share.vocab), share.vocab[0], shape.vocab_size, group)
        norm = RMSNorm(read("model.norm.weight"), shape.rms_norm_eps)
        model = cls(shape, share, embedding, layers, norm, head, Rotary(config, hd, device))
        return model.eval()

    def hidden_states(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        past: list[LayerKV] | None,
        keep: Sequence[int] | None = None,
        segments: SegmentLayout | None = None,
        segment_kernel: str | None = None,
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Final-norm hidden states of a packed sequence, and each layer's new keys/values (of every token).

        `segments` (with no `mask`): the pass packs many reads, each segment attended on its own keys only
        (`SegmentPlan` with `segment_kernel`, SEGMENT_KERNELS: None is "split" on CPU and "sdpa" elsewhere).

        `mask` (1, 1, tokens, past + tokens), booleans, True = may attend; None = causal. The hidden states are
        (tokens, hidden), or with `keep` (token indices) those rows only, in that order: the last layer then
        computes only them (`KeptRows`). `keep` is a host list: its rows are grouped by segment on the host, with
        no round trip through the device.

        With `bucket_rows` (AMX) the layers run `gemm_rows(tokens)` rows: padding rows of token 0 follow the
        tokens through the projections and row-wise ops and are never attended (`Attention.forward`).
        """
        tokens = len(token_ids)
        run_rows = gemm_rows(tokens) if self.bucket_rows else tokens
        hidden = self.embedding(F.pad(token_ids, (0, run_rows - tokens)) if run_rows > tokens else token_ids)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        past_length = int(past[0].keys.shape[1]) if past else 0
        layer_mask: torch.Tensor | TreeAfterPast | SegmentPlan | None = mask
        rows: KeptRows | SegmentRows | None = None
        if segments is not None:
            if mask is not None:
                raise ValueError("a packed pass takes segments or a mask, not both")
            kernel = segment_kernel or ("split" if hidden.device.type == "cpu" else "sdpa")
            plan = SegmentPlan.of(segments, past_length, hidden.dtype, hidden.device, kernel)
            layer_mask = plan
            if keep is not None:
                rows = SegmentRows.of(keep, plan, segments, hidden.device, self.bucket_rows)
        else:
            if mask is not None and hidden.device.type == "cpu":
                layer_mask = TreeAfterPast.of(mask, past_length, hidden.dtype) or mask
            if keep is not None:
                index = to_device(list(keep), hidden.device, torch.long)
                rows = KeptRows.of(index, mask, past_length, tokens, self.bucket_rows)
        last = len(self.layers) - 1
        new: list[LayerKV] = []
        if self.graph is not None and run_rows == tokens >= layer_graph.MIN_TOKENS:
            hidden = self._compiled_layers(hidden, cos, sin, layer_mask, past, rows, new)
            return self.norm(hidden[: tokens if keep is None else len(keep)]), new
        for index, layer in enumerate(self.layers):
            layer_past = past[index] if past is not None else None
            hidden, kv = layer(hidden, cos, sin, layer_mask, layer_past, rows if index == last else None)
            new.append(kv)
        return self.norm(hidden[: tokens if keep is None else len(keep)]), new

    def _compiled_layers(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | TreeAfterPast | SegmentPlan | None,
        past: list[LayerKV] | None,
        rows: KeptRows | SegmentRows | None,
        new: list[LayerKV],
    ) -> torch.Tensor:
        """`hidden_states`' layers with everything between two attentions one compiled call (`layer_graph`),
        replayed as a CUDA graph where the pass fits a captured bucket (`step_graphs`), and attention eager, as
        `Attention.attend` computes it; the last layer's kept rows leave eagerly."""
        assert self.graph is not None
        tokens, last = hidden.shape[0], len(self.layers) - 1
        bucket = self.step_graphs.bucket(tokens) if self.step_graphs is not None else None
        run: layer_graph.LayerRun | step_graphs.GraphedRun
        if self.step_graphs is not None and bucket is not None:
            run = self.step_graphs.run(bucket, hidden, cos, sin)
        else:
            run = layer_graph.LayerRun(self.graph, hidden, cos, sin)
        for index, layer in enumerate(self.layers):
            query, key, value = run.projected()
            kv = LayerKV(key, value)
            new.append(kv)
            layer_rows = rows if index == last else None
            layer_past = past[index] if past is not None else None
            attended = layer.attention.attend(query, kv, mask, layer_past, layer_rows, tokens)
            if layer_rows is None:
                assert attended is not None
                run.advance(index, attended)
                continue
            kept = run.rows().index_select(0, layer_rows.index)
            return kept if attended is None else layer.finish(kept, layer.attention.out(attended))
        return run.rows()

    def capture_graphs(self, mode: str, max_tokens: int | None = None) -> tuple[int, ...]:
        """Replays the compiled layers (`compile_layers`) as CUDA graphs per token-count bucket from now on, where
        `mode` is "auto", the device has graphs and they capture and match the compiled pass (`step_graphs`; logged
        otherwise); returns the captured buckets (none: the compiled pieces serve every pass)."""
        self.step_graphs = None
        if self.graph is None:
            return ()
        device = self.norm.weight.device
        graphs = step_graphs.build(self.graph, mode, device, max_tokens)
        try:
            if graphs is not None and not self._graphs_match(graphs):
                graphs = None
        except Exception as err:  # a replay that fails: the compiled pieces serve every pass
            logger.warning(
                "cuda graphs: a graphed pass failed; the compiled layers run without graphs",
                extra={"fields": {"error": f"{type(err).__name__}: {err}"[:500]}},
            )
            graphs = None
        self.step_graphs = graphs
        return graphs.captured if graphs is not None else ()

    def _graphs_match(self, graphs: step_graphs.StepGraphs) -> bool:
        """Whether a causal pass of 37 random tokens through the graphs equals the compiled pass (logged if not)."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, int(self.embedding.weight.shape[0]), (37,), generator=generator)
        ids = ids.to(self.norm.weight.device)
        positions = torch.arange(37, device=ids.device)
        with torch.inference_mode():
            self.step_graphs = graphs
            graphed, _ = self.hidden_states(ids, positions, None, None)
            self.step_graphs = None
            compiled, _ = self.hidden_states(ids, positions, None, None)
        worst = float((graphed.float() - compiled.float()).abs().max())
        tolerance = 1e-4 if graphed.dtype == torch.float32 else 3e-2
        if worst <= tolerance:
            return True
        logger.warning(
            "cuda graphs: a graphed pass differs from the compiled one; the compiled layers run without graphs",
            extra={"fields": {"max_abs_difference": worst, "tolerance": tolerance}},
        )
        return False

    def compile_layers(self) -> bool:
        """Runs the layers between attentions as compiled graphs from now on (`layer_graph`) where the model is not
        split over ranks and its GEMMs take unpadded rows; returns whether they are compiled (False where they do not
        apply, or inductor cannot build here: logged)."""
        if self.head.group.world_size > 1 or self.bucket_rows:
            return False
        first = self.layers[0]
        shape = layer_graph.LayerShape(
            heads=first.attention.heads,
            kv_heads=first.attention.kv_heads,
            head_dim=first.attention.head_dim,
            eps=self.shape.rms_norm_eps,
            hidden_size=self.shape.hidden_size,
            intermediate=int(first.mlp.gate_up.out_features) // 2,
        )
        dtype, device = self.norm.weight.dtype, self.norm.weight.device
        act = ACTIVATIONS[self.shape.hidden_act]
        weights = [layer.weights() for layer in self.layers if isinstance(layer, DecoderLayer)]
        self.graph = layer_graph.build(shape, weights, act, _rotate_form, dtype, device)
        return self.graph is not None

    def parameter_bytes(self) -> int:
        """Bytes of this rank's weights (a tied tensor counted once)."""
        seen: set[int] = set()
        total = linear_weight_bytes(self)
        for parameter in self.parameters():
            if parameter.data_ptr() not in seen:
                seen.add(parameter.data_ptr())
                total += parameter.numel() * parameter.element_size()
        return total
