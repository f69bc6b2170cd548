# Lab script for the 2026-12-03 notes (README.md beside it); run from the repository root:
#   .venv/bin/python bench/results/2026-12-03-zen3/blocked_causal.py [TOKENS ...]
# Causal float32 attention for a chain at Qwen3-0.6B's heads, two ways, alternating: torch's SDPA (the CPU flash
# kernel our decoder calls) and a blocked form built from GEMMs: query blocks of BLOCK rows, each one bmm against
# the keys up to its end (the key/value heads' query heads stacked, so no key is copied), a masked softmax in
# float32 and one bmm with the values. Both are compared with a float64 reference.
# ruff: noqa
import statistics, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import median_seconds as timed  # two warm-up calls, then the median of 7

torch.set_num_threads(2)
HEADS, KV_HEADS, DIM = 16, 8, 128
GROUP = HEADS // KV_HEADS
SCALE = DIM**-0.5


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=SCALE, enable_gqa=True)[0]


def blocked(q, k, v, block):
    tokens = q.shape[1]
    out = torch.empty_like(q)
    grouped = q.view(KV_HEADS, GROUP, tokens, DIM)
    for start in range(0, tokens, block):
        end = min(start + block, tokens)
        rows = end - start
        queries = grouped[:, :, start:end].reshape(KV_HEADS, GROUP * rows, DIM)
        scores = torch.bmm(queries, k[:, :end].transpose(1, 2)).mul_(SCALE).view(KV_HEADS, GROUP, rows, end)
        # Keys after a query's own position: only in the block's own square.
        above = torch.ones(rows, rows, dtype=torch.bool).triu_(1)
        scores[..., start:].masked_fill_(above, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(KV_HEADS, GROUP * rows, end)
        out.view(KV_HEADS, GROUP, tokens, DIM)[:, :, start:end] = torch.bmm(probs, v[:, :end]).view(
            KV_HEADS, GROUP, rows, DIM
        )
    return out




for tokens in [int(t) for t in sys.argv[1:]] or (570, 860, 2048):
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(HEADS, tokens, DIM, generator=g)
    k = torch.randn(KV_HEADS, tokens, DIM, generator=g)
    v = torch.randn(KV_HEADS, tokens, DIM, generator=g)
    exact = sdpa(q.double(), k.double(), v.double())
    line = f"{tokens} tokens: sdpa err {float((sdpa(q, k, v) - exact).abs().max()):.1e}"
    for block in (64, 128, 256):
        line += f", blocked {block} err {float((blocked(q, k, v, block) - exact).abs().max()):.1e}"
    times = {"sdpa": [], **{f"blocked {b}": [] for b in (64, 128, 256)}}
    for _ in range(3):  # interleaved, so that noise on this VM hits both
        times["sdpa"].append(timed(lambda: sdpa(q, k, v)))
        for b in (64, 128, 256):
            times[f"blocked {b}"].append(timed(lambda: blocked(q, k, v, b)))
    base = statistics.median(times["sdpa"])
    print(line)
    print("   " + " | ".join(f"{name} {statistics.median(t) * 1e3:.2f} ms ({base / statistics.median(t):.2f}x)" for name, t in times.items()))
