# Lab script for the 2026-12-03 Zen 4 notes (README.md beside it); run from the repository root:
#   .venv/bin/python bench/results/2026-12-03-zen4/chain_pieces.py [TOKENS ...]
# A causal chain (a request's state: the lead of a tree pass) at Qwen3-0.6B's heads (16 query, 8 key/value, 128
# wide), one layer, 2 threads, in bfloat16 and float32. torch's CPU flash kernel, called once with is_causal (what
# the decoder does), computes whole key blocks of 512 under the diagonal, so a 540-token chain costs about the
# full square. Cut into pieces of P queries, each piece is one dense call over the keys before it and one causal
# call over its own square, merged by log-sum-exp in float32: the decoder's own `_tree_after_past` with a one-block
# tree. Timed taking turns; errors against a float64 reference.
# ruff: noqa
import statistics, sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import median_seconds as timed  # two warm-up calls, then the median of 7

from decision_server.decoder import LayerKV, TreeAfterPast, _tree_after_past

torch.set_num_threads(2)
HEADS, KV_HEADS, DIM = 16, 8, 128
SCALE = DIM**-0.5
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def whole(q, k, v):
    return flash(q[None], k[None], v[None], 0.0, True, scale=SCALE)[0][0]


def pieces(q, k, v, size):
    tokens = q.shape[1]
    parts = [whole(q[:, :size], k[:, :size], v[:, :size])]
    for start in range(size, tokens, size):
        end = min(start + size, tokens)
        past = LayerKV(k[:, :start], v[:, :start])
        own = LayerKV(k[:, start:end], v[:, start:end])
        parts.append(_tree_after_past(q[:, start:end], own, past, TreeAfterPast(((0, end - start, None),)), SCALE))
    return torch.cat(parts, dim=1)


print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
for tokens in [int(t) for t in sys.argv[1:]] or (540, 860):
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(tokens)
        q = torch.randn(HEADS, tokens, DIM, generator=g).to(dtype)
        k = torch.randn(KV_HEADS, tokens, DIM, generator=g).to(dtype)
        v = torch.randn(KV_HEADS, tokens, DIM, generator=g).to(dtype)
        exact = whole(q.double(), k.double(), v.double())
        runs = {"whole": lambda: whole(q, k, v), **{f"pieces {p}": (lambda p=p: pieces(q, k, v, p)) for p in (128, 192, 272)}}
        errors = {name: float((run().double() - exact).abs().max()) for name, run in runs.items()}
        times = {name: [] for name in runs}
        for _ in range(3):  # taking turns, so that noise on this VM hits all
            for name, run in runs.items():
                times[name].append(timed(run))
        base = statistics.median(times["whole"])
        flops = 4 * HEADS * DIM * tokens * (tokens + 1) / 2
        print(f"{tokens} tokens {str(dtype).removeprefix('torch.')}: " + " | ".join(
            f"{name} {statistics.median(t) * 1e3:.2f} ms ({flops / statistics.median(t) / 1e9:.0f} GFLOP/s, "
            f"{base / statistics.median(t):.2f}x, err {errors[name]:.1e})" for name, t in times.items()))
