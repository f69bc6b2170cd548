"""In-process A/B: SmolLM2 float32 through the tree engine (8 questions over one state), eager layers against the
compiled ones (`--compile auto`, `layer_graph`), the same weights, interleaved runs, medians; and the largest
label log-probability difference between the two.

Run: .venv/bin/python bench/results/2026-12-06-layer-graph/read_ab.py [MATMUL] [RUNS] [STATE_TOKENS]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from decision_server.engines import ReadSpec, make_engine
from decision_server.model import LoadOptions, load_model
from decision_server.paths import default_model_dir


def main() -> None:
    matmul = sys.argv[1] if len(sys.argv) > 1 else "exact"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    state_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    eager = load_model(default_model_dir(), LoadOptions(dtype="float32", matmul=matmul))
    compiled = load_model(default_model_dir(), LoadOptions(dtype="float32", matmul=matmul, compile_mode="auto"))
    generator = torch.Generator().manual_seed(3)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(100, 40000, (count,), generator=generator).tolist())

    state = tokens(state_tokens)
    reads = [ReadSpec(id=i, prompt=state + tokens(6), labels=((28,), (29,), (30, 31))) for i in range(8)]
    engines = make_engine("auto", eager, 0), make_engine("auto", compiled, 0)
    first, second = (engine.run(reads).outcomes for engine in engines)
    worst = max(
        abs(x - y)
        for a, b in zip(first, second, strict=True)
        for x, y in zip(a.label_logprobs, b.label_logprobs, strict=True)
    )
    print(f"max |label logprob difference| {worst:.2e}")
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        for engine, kept in zip(engines, times, strict=True):
            started = time.perf_counter()
            engine.run(reads)
            kept.append(time.perf_counter() - started)
    before, after = (statistics.median(kept) * 1e3 for kept in times)
    print(f"matmul {eager.matmul}: eager {before:.1f} ms, compiled {after:.1f} ms, speedup {before / after:.3f}x")


if __name__ == "__main__":
    main()
