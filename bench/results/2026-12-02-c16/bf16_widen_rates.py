# Lab script (README.md beside it); run from the repository root.
# bfloat16 linears on a CPU without AMX: oneDNN's prepacked bfloat16 GEMM (what --dtype bfloat16 ran, and vLLM's
# kernel) against float32 GEMMs over the same bfloat16 values widened exactly (weights widened once at load, or on
# every call), at Qwen3-0.6B's decoder shapes; and how far each lands from a float64 product of the same values.
# ruff: noqa
import statistics, sys, time

import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(2)
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 540
shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
x16 = {name: torch.randn(rows, k).bfloat16() for name, (n, k) in shapes.items()}
w16 = {name: (torch.randn(n, k) * k**-0.5).bfloat16() for name, (n, k) in shapes.items()}
packed = {name: torch.ops.mkldnn._reorder_linear_weight(w, None) for name, w in w16.items()}
w32 = {name: w.float() for name, w in w16.items()}


def onednn(name):
    return torch.ops.mkldnn._linear_pointwise(x16[name], packed[name], None, "none", [], "")


def widened_stored(name):
    return F.linear(x16[name].float(), w32[name]).bfloat16()


def widened_per_call(name):
    return F.linear(x16[name].float(), w16[name].float()).bfloat16()


kinds = {"onednn bf16 (packed)": onednn, "widened, stored fp32": widened_stored, "widened per call": widened_per_call}
for kind, run in kinds.items():
    worst = 0.0
    for name in shapes:
        exact = (x16[name].double() @ w16[name].double().T)
        worst = max(worst, ((run(name).double() - exact).abs() / exact.abs().clamp(min=1e-3)).max().item())
    print(f"{kind}: max relative error against float64 {worst:.2e}")
times = {kind: [] for kind in kinds}
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
    for kind, run in kinds.items():
        start = time.perf_counter()
        for name in shapes:
            run(name)
        times[kind].append(time.perf_counter() - start)
flops = sum(2 * rows * n * k for n, k in shapes.values())
for kind, values in times.items():
    t = statistics.median(values)
    print(f"{kind}: {t * 1e3:.1f} ms per layer at {rows} rows, {flops / t / 1e9:.0f} GFLOP/s")
