"""oneDNN's prepacked bfloat16 GEMM (the decoder's bfloat16 linears) at the decoder's four shapes by row count, on
2 threads: GFLOP/s with one weight reused (hot) and with 28 weights in turn (cold, as a forward reads its layers),
and the attention output projection (1024 x 2048) over row counts, where 512-576 rows run slow.

    python gemm_rows.py              (any directory; the deps venv's Python)
"""

# ruff: noqa  (a lab script, kept as it was run)

import time

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
SHAPES = [(6144, 1024), (4096, 1024), (1024, 2048), (1024, 3072)]  # gate/up, qkv, o, down (out, in)


def rate(x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    def linear(w: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    linear(weights[0])
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for w in weights:
            linear(w)
        best = min(best, (time.perf_counter() - start) / len(weights))
    n, k = weights[0].size(0), x.shape[1]
    return 2 * x.shape[0] * n * k / best / 1e9


for rows in (320, 540, 860):
    for n, k in SHAPES:
        packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).bfloat16(), None) for _ in range(28)]
        x = torch.randn(rows, k).bfloat16()
        print(f"rows {rows} {n}x{k}: hot {rate(x, packed[:1] * 28):.0f} GFLOP/s, cold (28 weights) {rate(x, packed):.0f}")
packed = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(1024, 2048).bfloat16(), None) for _ in range(8)]
line = [f"{rows}:{rate(torch.randn(rows, 2048).bfloat16(), packed):.0f}" for rows in (256, 384, 448, 512, 540, 576, 640, 768, 860, 1024)]
print("1024x2048 by rows (GFLOP/s):", " ".join(line))
