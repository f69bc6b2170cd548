# Lab script, kept as it was run for the 2026-12-02 notes (README.md beside it); run from the repository root.
# ruff: noqa
from rates import SHAPES, median_seconds as bench
import time, torch, torch.nn.functional as F

torch.set_num_threads(2)
M = 862
shapes = SHAPES




tot = {}
for name, (K, N) in shapes.items():
    w = torch.randn(N, K) * 0.02
    x = torch.randn(M, K)
    ref = F.linear(x.double(), w.double())
    ws = w.abs().amax(1) / 127
    wq = torch.round(w / ws[:, None]).to(torch.int8)
    wqt = wq.t().contiguous()
    wqt_cm = wq.t()  # column-major view

    def q8(x):
        xs = x.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
        xq = torch.round(x / xs).to(torch.int8)
        return (torch._int_mm(xq, wqt).float() * xs) * ws

    r = {"f32": bench(lambda: F.linear(x, w)), "intmm rowscale": bench(lambda: q8(x))}
    xs = x.abs().amax(1, keepdim=True) / 127
    xq = torch.round(x / xs).to(torch.int8)
    r["intmm only"] = bench(lambda: torch._int_mm(xq, wqt))
    r["intmm only cm"] = bench(lambda: torch._int_mm(xq, wqt_cm))
    e = float((q8(x).double() - ref).abs().max() / ref.abs().max())
    fl = 2 * M * K * N
    print(name, f"relerr {e:.1e}", " | ".join(f"{k}:{fl / v / 1e9:.0f}" for k, v in r.items()))
    for k, v in r.items():
        tot[k] = tot.get(k, 0) + v
print("per layer ms", {k: round(v * 1e3, 1) for k, v in tot.items()})
