"""Lab script of 2026-12-04 evening, Zen 5 (README.md here): torch's CPU flash kernel at one layer's shapes (Qwen3-0.6B)."""

# ruff: noqa  (a lab script, kept as it was run)

import time, statistics, torch
torch.manual_seed(0)
torch.set_num_threads(2)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
def bench(fn, n=15):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return min(ts)*1e3, statistics.median(ts)*1e3
for dt in (torch.bfloat16, torch.float32):
    H, KV, D = 16, 8, 128
    for (q, k, causal) in ((540, 540, True), (560, 560, True), (320, 560, False), (860, 860, True), (128,128,True)):
        Q = torch.randn(1, H, q, D).to(dt); K = torch.randn(1, KV, k, D).to(dt); V = torch.randn(1, KV, k, D).to(dt)
        f = lambda: flash(Q, K, V, 0.0, causal, scale=D**-0.5)
        flops = 4 * q * k * D * H * (0.5 if causal else 1)
        # manual: expand kv heads, bmm scores in dt, softmax fp32, bmm
        Ke = K.repeat_interleave(2, dim=1); Ve = V.repeat_interleave(2, dim=1)
        def man():
            s = torch.matmul(Q, Ke.transpose(-1, -2)).float() * D**-0.5
            if causal: s = s + torch.full((q,k), float('-inf')).triu(1+k-q)
            p = torch.softmax(s, -1).to(dt)
            return torch.matmul(p, Ve)
        a = bench(f); b = bench(man)
        print(f"{dt} q{q} k{k} causal={causal}: flash {a[0]:.2f}/{a[1]:.2f} ms {flops/a[0]/1e6:.0f} GF/s; manual {b[0]:.2f}/{b[1]:.2f} ms {flops/b[0]/1e6:.0f} GF/s")
