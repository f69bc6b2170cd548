"""float32 causal chain attention on CPU, one thread: `decoder._gemm_chain` (64-query GEMM blocks) against one flash
call, by query width (heads x head_dim) and length.

Run: .venv/bin/python bench/results/2026-12-06-layer-graph/chain_kernels.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from decision_server.decoder import _gemm_chain

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def median_ms(fn: Callable[[], object], runs: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for heads, kv_heads, head_dim in [(4, 2, 16), (4, 2, 32), (4, 2, 64), (9, 3, 64), (16, 8, 128)]:
        for tokens in (512, 860):
            query = torch.randn(tokens, heads, head_dim).transpose(0, 1)
            keys, values = torch.randn(kv_heads, tokens, head_dim), torch.randn(kv_heads, tokens, head_dim)
            scale = head_dim**-0.5
            with torch.inference_mode():
                gemm = median_ms(lambda q=query, k=keys, v=values, s=scale: _gemm_chain(q, k, v, s))
                flash = median_ms(
                    lambda q=query, k=keys, v=values, s=scale: FLASH(q[None], k[None], v[None], 0.0, True, scale=s)
                )
            print(
                f"heads {heads} kv {kv_heads} head_dim {head_dim} width {heads * head_dim} tokens {tokens}: "
                f"gemm_chain {gemm:.3f} ms, flash {flash:.3f} ms, flash/gemm {flash / gemm:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
