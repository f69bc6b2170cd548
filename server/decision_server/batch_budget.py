"""The batch budget: how many packed tokens one forward pass may hold, chosen once at load for the device.
The router packs its shard calls to it (Info's `batch_token_budget`) unless the operator gave both a value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from decision_server.model_base import LoadedModel
from decision_server.prefix_cache import CachePlan, free_memory_bytes, kv_bytes_per_token

# On CPU: the budget the router has always packed its calls to (its default before the budget was the shard's).
# It is not a measurement of the best CPU budget: the tree engine of 2026-12-02 computed the same tokens/s at 1,024,
# 2,048 and 4,096 packed tokens (bench/results/2026-12-02-c16/packed_rates_nocache.txt), 8,192 was not timed, and
# one-pass batches change what a larger budget buys; the tree engine's rewrite re-measures it.
CPU_TOKENS = 8192
# On CUDA, the share of the memory free after the weights and the prefix cache's budget that one forward's
# activations may take: the rest is the allocator's slack, and the transients the estimate leaves out.
DEVICE_SHARE = 0.5
# Bounds of the auto budget. Below MIN_TOKENS a GPU forward is launch-bound; beyond MAX_TOKENS one forward only
# adds latency (Qwen3-0.6B at 40 % of an H100's bfloat16 peak computes about 450,000 tokens/s: 131,072 tokens are
# about 0.3 s), so the rule never goes past it however much memory is free.
MIN_TOKENS = 8192
MAX_TOKENS = 131072
# The auto budget is a whole number of these.
ROUND_TOKENS = 1024


@dataclass(frozen=True)
class BatchBudget:
    """The packed tokens one forward pass may hold, and `rule`, the sentence Info shows for how it was chosen."""

    tokens: int
    rule: str


def activation_bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    """Bytes one packed token costs during a forward pass of the whole model, estimated from its config.

    One layer's live tensors at its widest (the residual stream and its normed copy, the attention input and
    output, queries, keys and values, the MLP's gate, up and their product: one layer runs at a time), plus the
    keys/values of every layer, which a pass keeps for the prefix cache and for the branches that continue it.
    An MoE layer's MLP counts the experts each token is routed to."""
    hidden = int(text_config.hidden_size)
    heads = int(text_config.num_attention_heads)
    kv_heads = int(getattr(text_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text_config, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(text_config, "intermediate_size", None) or 4 * hidden)
    routed = int(getattr(text_config, "num_experts_per_tok", None) or 0)
    expert = int(getattr(text_config, "moe_intermediate_size", None) or 0)
    mlp = max(intermediate, routed * expert)
    layer = 4 * hidden + (2 * heads + 2 * kv_heads) * head_dim + 3 * mlp
    return layer * dtype.itemsize + kv_bytes_per_token(text_config, dtype)


def logit_bytes(vocab_size: int, rows: int, dtype: torch.dtype) -> int:
    """Bytes of `rows` full-vocabulary logit rows: the LM head's output in the model's dtype and the float32
    log-softmax the label log-probabilities are read from."""
    return rows * vocab_size * (dtype.itemsize + 4)


def plan_batch_budget(
    model: LoadedModel, cache_plan: CachePlan, requested: int | None, *, logit_rows: int
) -> BatchBudget:
    """The batch budget for --max-batch-prefill-tokens `requested` (None: auto). The operator's value wins; on
    CPU auto is CPU_TOKENS; on CUDA it is DEVICE_SHARE of the memory free after the weights (measured now, once
    they are loaded) and the prefix cache's budget (`cache_plan`: it fills later), less `logit_rows` logit rows
    (the most one pass scores), divided by `activation_bytes_per_token`, then clamped to [MIN_TOKENS,
    MAX_TOKENS] and rounded down to ROUND_TOKENS. Every rank of a tensor-parallel group gets the smallest.

    The estimate is the whole model's per token: a tensor-parallel rank holds only its share of the heads and of
    the MLP, so on more than one rank the budget is on the safe side."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--max-batch-prefill-tokens must be at least 1, got {requested}")
        return BatchBudget(requested, f"--max-batch-prefill-tokens {requested}")
    if model.device.type != "cuda":
        return BatchBudget(CPU_TOKENS, f"auto on {model.device.type}: {CPU_TOKENS} tokens, the CPU default")
    free = free_memory_bytes(model.device)
    here, total = model.kv_heads_share
    cache = cache_plan.capacity_bytes * here // total
    logits = logit_bytes(model.vocab_size, logit_rows, model.dtype)
    per_token = activation_bytes_per_token(model.text_config, model.dtype)
    fitted = max(0, int(DEVICE_SHARE * max(0, free - cache)) - logits) // per_token
    own = min(MAX_TOKENS, max(MIN_TOKENS, fitted)) // ROUND_TOKENS * ROUND_TOKENS
    tokens = model.agree_min(own)
    mib = 1024 * 1024
    rule = (
        f"auto on cuda: {tokens} tokens ({fitted} fit in {DEVICE_SHARE:.0%} of what the {cache // mib} MiB prefix "
        f"cache leaves of the {free // mib} MiB free after loading, less {logits // mib} MiB for {logit_rows} logit "
        f"rows, at {per_token // 1024} KiB per packed token; clamped to [{MIN_TOKENS}, {MAX_TOKENS}], rounded down "
        f"to {ROUND_TOKENS})"
    )
    if tokens < own:
        rule += f"; {own} on this rank, the smallest of the tensor-parallel ranks is kept"
    return BatchBudget(tokens, rule)
