# Lab script (README.md beside it); run from the repository root.
# A float32 GEMM from AMX bfloat16 passes, for weights that are exactly bfloat16 (bf16 checkpoints): x = hi + lo
# with hi = bf16(x), lo = x - hi; x @ W = hi @ W + lo @ W, both products taken by oneDNN with bfloat16 inputs and
# float32 sums and output (torch.backends.mkldnn.matmul.fp32_precision = "bf16"), the two row blocks in one call.
# Against MKL float32 (the shard's `exact`): time per decoder layer and error against float64; then the same swap
# in a whole tree read (label log-probabilities against exact).
# ruff: noqa
import statistics, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(2)
mkl = torch.backends.mkldnn.matmul


def split_linear(x, w, bias=None):
    hi = x.bfloat16().float()
    rows = x.shape[0]
    mkl.fp32_precision = "bf16"
    try:
        both = F.linear(torch.cat((hi, x - hi)), w)
    finally:
        mkl.fp32_precision = "none"
    out = both[:rows] + both[rows:]
    return out if bias is None else out + bias


shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 540
x = {n: torch.randn(rows, k) for n, (o, k) in shapes.items()}
w = {n: (torch.randn(o, k) * k**-0.5).bfloat16().float() for n, (o, k) in shapes.items()}
for kind, run in (("exact (MKL float32)", F.linear), ("split bf16 (AMX)", split_linear)):
    worst = max(
        ((run(x[n], w[n]).double() - x[n].double() @ w[n].double().T).abs().max() / (x[n].double() @ w[n].double().T).abs().max()).item()
        for n in shapes
    )
    times = []
    for _ in range(10):
        start = time.perf_counter()
        for n in shapes:
            run(x[n], w[n])
        times.append(time.perf_counter() - start)
    print(f"{kind}: {statistics.median(times) * 1e3:.1f} ms per layer at {rows} rows, max error / max |y| {worst:.1e}")

if len(sys.argv) > 1 and sys.argv[1] != "-":
    sys.path.insert(0, "server/bench")
    from reads_bench import make_reads
    from decision_server import layers
    from decision_server.engines import TreeEngine
    from decision_server.model import LoadOptions, load_model

    model = load_model(Path(sys.argv[1]), LoadOptions(dtype="float32", threads=2))
    exact_weights = all(
        torch.equal(m.weight, m.weight.bfloat16().float())
        for m in model.modules()
        if isinstance(m, layers.ColumnParallelLinear | layers.RowParallelLinear)
    )
    print(f"every linear weight exactly bfloat16: {exact_weights}")
    reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
    engine = TreeEngine(model)
    plain = layers.matmul
    results, times = {}, {"exact": [], "split": []}
    engine.run(reads)
    for _ in range(3):
        for kind in ("exact", "split"):
            layers.matmul = plain if kind == "exact" else (lambda a, wt, b=None: split_linear(a, wt, b))
            out = engine.run(reads)
            times[kind].append(out.forward_seconds)
            results[kind] = out
    layers.matmul = plain
    worst = max(
        abs(p - q)
        for a, b in zip(results["exact"].outcomes, results["split"].outcomes)
        for p, q in zip(a.label_logprobs, b.label_logprobs)
    )
    e, s = statistics.median(times["exact"]), statistics.median(times["split"])
    print(f"tree read: exact {e:.2f} s, split {s:.2f} s ({e / s:.2f}x); max |dlogprob| {worst:.1e}")
