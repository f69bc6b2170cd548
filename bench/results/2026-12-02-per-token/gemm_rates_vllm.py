# Lab script, kept as it was run for the 2026-12-02 notes (README.md beside it); run from the repository root.
# ruff: noqa
from rates import SHAPES, median_seconds as bench
import time, sys, torch, torch.nn.functional as F
from vllm import _custom_ops as ops

torch.set_num_threads(2)
M = int(sys.argv[1]) if len(sys.argv) > 1 else 862
shapes = SHAPES




tot = {}
for name, (K, N) in shapes.items():
    r = {}
    for dt in (torch.float32, torch.bfloat16):
        w = (torch.randn(N, K) * 0.02).to(dt)
        x = torch.randn(M, K).to(dt)
        h = ops.create_onednn_mm(w.t(), 32)
        r[f"vllm {dt}"] = bench(lambda: ops.onednn_mm(h, x, None))
        r[f"torch F.linear {dt}"] = bench(lambda: F.linear(x, w))
    fl = 2 * M * K * N
    print(name, " | ".join(f"{k}:{fl / v / 1e9:.0f}" for k, v in r.items()))
    for k, v in r.items():
        tot[k] = tot.get(k, 0) + v
print("per layer ms", {k: round(v * 1e3, 1) for k, v in tot.items()})
