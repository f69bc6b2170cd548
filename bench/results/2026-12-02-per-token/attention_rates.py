# Lab script, kept as it was run for the 2026-12-02 notes (README.md beside it); run from the repository root.
# ruff: noqa
from rates import SHAPES, median_seconds as bench
import time, torch, torch.nn.functional as F

torch.set_num_threads(2)




flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
H, KV, D = 16, 8, 128
for Tq, Tk, causal in ((540, 540, True), (320, 540, False), (860, 860, True)):
    q = torch.randn(1, H, Tq, D)
    k = torch.randn(1, KV, Tk, D)
    v = torch.randn(1, KV, Tk, D)
    s = D**-0.5
    f = lambda: flash(q, k, v, 0.0, causal, scale=s)

    def math():
        kk = k.repeat_interleave(H // KV, 1)
        vv = v.repeat_interleave(H // KV, 1)
        sc = torch.matmul(q, kk.transpose(-1, -2)) * s
        if causal:
            sc.masked_fill_(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
        return torch.matmul(sc.softmax(-1), vv)

    def math_gqa():
        # group query heads per kv head: (KV, G*Tq, D) @ (KV, D, Tk)
        qg = q.view(KV, (H // KV) * Tq, D)
        sc = (
            torch.baddbmm(torch.empty(0), qg, k[0].transpose(-1, -2), beta=0, alpha=s)
            if False
            else torch.bmm(qg, k[0].transpose(-1, -2)).mul_(s)
        )
        if causal:
            sc = sc.view(KV, H // KV, Tq, Tk)
            sc.masked_fill_(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), float("-inf"))
            sc = sc.view(KV, -1, Tk)
        return torch.bmm(torch.softmax(sc, -1), v[0])

    ref = f()[0]
    err = (math_gqa().view(1, H, Tq, D) - ref).abs().max().item()
    fl = 4 * H * Tq * Tk * D * (0.5 if causal else 1)
    for name, fn in (("flash", f), ("math", math), ("math_gqa", math_gqa)):
        t = bench(fn)
        print(f"Tq {Tq} Tk {Tk} causal {causal} {name}: {t * 1e3:.2f} ms {fl / t / 1e9:.0f} useful GF/s")
    print("err", err)
