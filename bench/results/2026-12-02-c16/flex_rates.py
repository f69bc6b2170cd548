# Lab script (README.md beside it); run from the repository root.
# PyTorch FlexAttention (compiled, CPU) against the shard's attention for the two passes of a tree read at
# Qwen3-0.6B's attention shape (16 query heads, 8 key/value heads, head_dim 128, float32): the chain (540 tokens,
# causal) and the branches (8 questions x 40 tokens after those 540, tree mask). Medians of alternating runs.
# ruff: noqa
import statistics, sys, time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from decision_server.decoder import LayerKV, TreeAfterPast, _tree_after_past

torch.manual_seed(0)
torch.set_num_threads(2)
H, KV, D, PAST, Q, BR = 16, 8, 128, 540, 40, 8
scale = D**-0.5
new = BR * Q
q_chain = torch.randn(1, H, PAST, D)
k_chain, v_chain = torch.randn(1, KV, PAST, D), torch.randn(1, KV, PAST, D)
q_br = torch.randn(1, H, new, D)
k_new, v_new = torch.randn(1, KV, new, D), torch.randn(1, KV, new, D)
k_all, v_all = torch.cat((k_chain, k_new), 2), torch.cat((v_chain, v_new), 2)

branch_of = torch.arange(new) // Q
allowed = torch.ones(new, PAST + new, dtype=torch.bool)
own = (branch_of[:, None] == branch_of[None, :]) & (torch.arange(new)[:, None] >= torch.arange(new)[None, :])
allowed[:, PAST:] = own
tree = TreeAfterPast.of(allowed[None, None], PAST, torch.float32)


def causal(b, h, qi, ki):
    return qi >= ki


def tree_mod(b, h, qi, ki):
    return (ki < PAST) | ((branch_of[qi] == branch_of[(ki - PAST).clamp(min=0)]) & (qi + PAST >= ki))


flex = torch.compile(flex_attention, dynamic=False)
chain_mask = create_block_mask(causal, None, None, PAST, PAST, device="cpu")
tree_mask = create_block_mask(tree_mod, None, None, new, PAST + new, device="cpu")

sdpa = torch.nn.functional.scaled_dot_product_attention
runs = {
    "chain: torch flash (is_causal)": lambda: sdpa(q_chain, k_chain, v_chain, is_causal=True, scale=scale, enable_gqa=True),
    "chain: flex": lambda: flex(q_chain, k_chain, v_chain, block_mask=chain_mask, scale=scale, enable_gqa=True),
    "branches: shard (TreeAfterPast)": lambda: _tree_after_past(
        q_br[0], LayerKV(k_new[0], v_new[0]), LayerKV(k_chain[0], v_chain[0]), tree, scale
    ),
    "branches: torch flash, dense mask": lambda: sdpa(q_br, k_all, v_all, attn_mask=allowed[None, None], scale=scale, enable_gqa=True),
    "branches: flex": lambda: flex(q_br, k_all, v_all, block_mask=tree_mask, scale=scale, enable_gqa=True),
}
reference = {
    "chain": runs["chain: torch flash (is_causal)"](),
    "branches": runs["branches: torch flash, dense mask"](),
}
for name, run in runs.items():
    out = run()
    out = out if out.dim() == 4 else out.unsqueeze(0)
    print(f"{name}: max |diff| against torch flash {(out - reference[name.split(':')[0]]).abs().max().item():.1e}")
times = {name: [] for name in runs}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - start)
for name, values in times.items():
    print(f"{name}: {statistics.median(values) * 1e3:.2f} ms per layer (median of {len(values)})")
