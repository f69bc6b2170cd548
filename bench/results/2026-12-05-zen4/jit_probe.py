# ruff: noqa
"""Lab: the first oneDNN GEMM call at a row count the process has not seen, against a later call at that count, at
the Qwen3-0.6B decoder's four shapes over prepacked weights (bfloat16, and float32 as `--matmul fast` packs it).
Usage: python jit_probe.py [counts]   (2 threads)"""

import statistics, sys, time
import torch

torch.set_num_threads(2)
SHAPES = {
    "gate/up 1024x6144": (1024, 6144),
    "down 3072x1024": (3072, 1024),
    "qkv 1024x4096": (1024, 4096),
    "out 2048x1024": (2048, 1024),
}
counts = int(sys.argv[1]) if len(sys.argv) > 1 else 6
print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
for dtype in (torch.bfloat16, torch.float32):
    for name, (fan_in, fan_out) in SHAPES.items():
        weight = torch.randn(fan_out, fan_in).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        run = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        run(torch.randn(860, fan_in).to(dtype))
        first, again = [], []
        for i in range(counts):
            x = torch.randn(861 + 7 * i, fan_in).to(dtype)  # a count never run before in this process
            t = time.perf_counter()
            run(x)
            first.append(time.perf_counter() - t)
            t = time.perf_counter()
            run(x)
            again.append(time.perf_counter() - t)
        f, a = statistics.median(first) * 1e3, statistics.median(again) * 1e3
        print(
            f"{str(dtype)[6:]:9s} {name:18s} seen {a:6.2f} ms  new {f:6.2f} ms  (+{f - a:5.2f} ms, {f / a:.2f}x)",
            flush=True,
        )
