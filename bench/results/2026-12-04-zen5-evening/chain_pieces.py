"""Lab script of 2026-12-04 evening, Zen 5 (README.md here): torch's CPU flash kernel at one layer's shapes (Qwen3-0.6B)."""

# ruff: noqa  (a lab script, kept as it was run)

import time, statistics, torch
torch.manual_seed(0); torch.set_num_threads(2)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
def bench(fn, n=15):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)*1e3
def chunked(Q, K, V, b, scale):
    n = Q.shape[2]; outs = []
    for s in range(0, n, b):
        e = min(n, s + b)
        own, own_lse = flash(Q[:, :, s:e], K[:, :, s:e], V[:, :, s:e], 0.0, True, scale=scale)[:2]
        if s == 0:
            outs.append(own); continue
        old, old_lse = flash(Q[:, :, s:e], K[:, :, :s], V[:, :, :s], 0.0, False, scale=scale)[:2]
        top = torch.maximum(old_lse, own_lse)
        wo = torch.exp(old_lse - top).unsqueeze(-1); wn = torch.exp(own_lse - top).unsqueeze(-1)
        outs.append(((old.float() * wo + own.float() * wn) / (wo + wn)).to(Q.dtype))
    return torch.cat(outs, dim=2)
for dt in (torch.bfloat16, torch.float32):
    H, KV, D = 16, 8, 128
    for n in (540, 860):
        Q = torch.randn(1, H, n, D).to(dt); K = torch.randn(1, KV, n, D).to(dt); V = torch.randn(1, KV, n, D).to(dt)
        ref = flash(Q, K, V, 0.0, True, scale=D**-0.5)[0]
        base = bench(lambda: flash(Q, K, V, 0.0, True, scale=D**-0.5))
        line = f"{dt} n{n}: whole {base:.2f} ms"
        for b in (128, 192, 256, 288, 384):
            if b >= n: continue
            got = chunked(Q, K, V, b, D**-0.5)
            err = (got.float() - ref.float()).abs().max().item()
            t = bench(lambda: chunked(Q, K, V, b, D**-0.5))
            line += f"; b{b} {t:.2f} ({base/t:.2f}x, err {err:.1e})"
        print(line)
