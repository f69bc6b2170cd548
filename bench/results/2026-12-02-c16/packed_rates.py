# Lab script (README.md beside it); run from the repository root.
# Per-token forward cost of the tree engine as more requests (each its own 540-token state + 8 questions of 40
# tokens) are packed into one batch, against max_packed_tokens: does a bigger batch compute tokens more slowly?
# ruff: noqa
import statistics, sys, time
from pathlib import Path

import torch

sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache

model = load_model(Path(sys.argv[1]), LoadOptions(dtype="float32", threads=2))
budgets = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "4096").split(",")]
counts = [int(c) for c in (sys.argv[3] if len(sys.argv) > 3 else "1,2,4").split(",")]  # -N: N in one chunk
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
cache_mb = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # the served default keeps a prefix cache


seeds = iter(range(100, 1 << 30))  # every request a new state: no cache hits, as in the served runs


def batch(requests: int):
    reads = []
    for r in range(requests):
        for read in make_reads(model.token_limit, 540, 8, 40, seed=next(seeds)):
            reads.append(read.__class__(id=len(reads), prompt=read.prompt, labels=read.labels))
    return reads


TreeEngine(model).run(batch(1))  # warm
rows = {}
for _ in range(rounds):
    for budget in budgets:
        engine = TreeEngine(
            model, max_packed_tokens=budget, prefix_cache=PrefixCache(cache_mb << 20) if cache_mb else None
        )
        for requests in counts:
            reads = batch(requests)
            if requests < 0:  # the same requests, all in one chunk (the chunking before 2026-12-02's fix)
                reads = batch(-requests)
                engine._chunks = lambda reads: [list(reads)]
            start = time.perf_counter()
            out = engine.run(reads)
            took = time.perf_counter() - start
            rows.setdefault((budget, requests), []).append(
                (out.packed_tokens / took, out.forward_passes, took, out.packed_tokens / out.forward_seconds)
            )
for (budget, requests), values in sorted(rows.items()):
    rate = statistics.median(v[0] for v in values)
    forward = statistics.median(v[3] for v in values)
    print(f"budget {budget:5d} requests {requests:2d}: {rate:6.1f} tokens/s ({forward:6.1f} per forward-s; median of {len(values)}), passes {values[0][1]}, seconds {[round(v[2], 2) for v in values]}")
