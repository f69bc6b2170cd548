# Lab script, kept as it was run for the 2026-12-02 notes (README.md beside it); run from the repository root.
# ruff: noqa
from rates import SHAPES, median_seconds as bench
import time, sys, torch, torch.nn.functional as F

torch.set_num_threads(2)
M = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 862
# --no-f16: CPUs without AVX512-FP16 (Zen 4) cannot pack float16 weights; added for ../2026-12-02-zen4/
shapes = SHAPES




lp = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
tot = {}
for name, (K, N) in shapes.items():
    w = torch.randn(N, K) * 0.02
    x = torch.randn(M, K)
    ref = x.double() @ w.double().T
    r = {}
    err = {}
    for label, dt, packed in (
        ("f32 mkl", torch.float32, False),
        ("f32 onednn", torch.float32, True),
        # AVX2-only CPUs (Zen 3, ../2026-12-03-zen3/) cannot pack bfloat16: F.linear converts it on every call there
        ("bf16 onednn", torch.bfloat16, True) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ("bf16 F.linear", torch.bfloat16, False),
        *(() if "--no-f16" in sys.argv else (("f16 onednn", torch.float16, True), ("f16 F.linear", torch.float16, False))),
    ):
        wd = w.to(dt)
        xd = x.to(dt)
        if packed:
            p = torch.ops.mkldnn._reorder_linear_weight(wd, None)
            fn = lambda: lp(xd, p)
        else:
            fn = lambda: F.linear(xd, wd)
        r[label] = bench(fn)
        err[label] = float((fn().double() - ref).abs().max() / ref.abs().max())
    fl = 2 * M * K * N
    print(name, " | ".join(f"{k}:{fl / v / 1e9:.0f}GF/s relerr {err[k]:.1e}" for k, v in r.items()))
    for k, v in r.items():
        tot[k] = tot.get(k, 0) + v
print("per layer ms", {k: round(v * 1e3, 1) for k, v in tot.items()})
