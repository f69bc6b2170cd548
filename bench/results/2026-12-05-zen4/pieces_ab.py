# ruff: noqa
"""Lab: one tree read (8 reads over a 540-token head with 40-token tails, one pass) with causal chains in pieces
(`decoder._causal_chain`, 2026-12-05: masked flash calls in bfloat16; from the second run on, batched GEMMs in
float32, before that one call there) against one causal call per chain (the code before), taking turns in one
process. Usage: DTYPE=bfloat16|float32 python pieces_ab.py MODEL [ROUNDS]   (repository root, PYTHONPATH=server,
MKL dispatch and tcmalloc preloaded as the launcher does on AMD)"""

import os, statistics, sys
from pathlib import Path

sys.path.insert(0, "server/bench")
from reads_bench import make_reads

from decision_server import decoder
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model

DTYPE = os.environ.get("DTYPE", "bfloat16")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=DTYPE, threads=2, compile_mode="auto", matmul="auto"))
tree = TreeEngine(model)
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
limit = decoder.MAX_PIECED_CHAIN_TOKENS
times = {"one call": [], "pieces": []}
for _ in range(2):
    for on in (False, True):
        decoder.MAX_PIECED_CHAIN_TOKENS = limit if on else 0
        tree.run(reads)
for k in range(rounds):
    for on in (False, True) if k % 2 == 0 else (True, False):
        decoder.MAX_PIECED_CHAIN_TOKENS = limit if on else 0
        times["pieces" if on else "one call"].append(tree.run(reads).forward_seconds)
one, pieces = statistics.median(times["one call"]), statistics.median(times["pieces"])
print(
    f"{DTYPE} ({model.matmul if DTYPE == 'float32' else 'bfloat16'}), {rounds} rounds, medians: one call {one * 1e3:.0f} ms, pieces {pieces * 1e3:.0f} ms: {one / pieces:.3f}x"
)
