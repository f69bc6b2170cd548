"""A bfloat16 tree read whose token count the process has seen before, against one whose count is new, as the served
workload runs them (every decision-bench request packs a different number of tokens): without the row buckets
(`DecoderLM.bucket_rows` off, the code before 2026-12-05) and with them, taking turns in one process.

    python new_shapes.py MODEL [ROUNDS]     (from the repository root, PYTHONPATH=server, tcmalloc preloaded)

DTYPE=float32 MATMUL=fast|split|exact measures a float32 mode instead.
"""

# ruff: noqa  (a lab script, kept as it was run)

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "server/bench")
from reads_bench import make_reads  # noqa: E402

from decision_server.engines import TreeEngine  # noqa: E402
from decision_server.model import LoadOptions, load_model  # noqa: E402

DTYPE = os.environ.get("DTYPE", "bfloat16")
MATMUL = os.environ.get("MATMUL", "auto")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=DTYPE, threads=2, compile_mode="auto", matmul=MATMUL))
network = model.network
tree = TreeEngine(model)
seen = make_reads(model.token_limit, 540, 8, 40, seed=1)
times = {"plain, seen count": [], "plain, new count": [], "buckets, seen count": [], "buckets, new count": []}
head = 541
for bucket in (False, True):
    network.bucket_rows = bucket
    for _ in range(3):
        tree.run(seen)
for k in range(rounds):
    for bucket in ((False, True) if k % 2 == 0 else (True, False)):
        network.bucket_rows = bucket
        name = "buckets" if bucket else "plain"
        # A head of a length no earlier read had: a packed token count this process has not computed yet.
        fresh = make_reads(model.token_limit, head, 8, 40, seed=100 + head)
        head += 1
        times[f"{name}, new count"].append(tree.run(fresh).forward_seconds)
        times[f"{name}, seen count"].append(tree.run(seen).forward_seconds)
print(f"{DTYPE} ({model.matmul if DTYPE == 'float32' else 'bfloat16'}), {rounds} rounds, medians:")
for name, values in times.items():
    print(f"  {name}: {statistics.median(values) * 1e3:.0f} ms")
plain_new, bucket_new = statistics.median(times["plain, new count"]), statistics.median(times["buckets, new count"])
print(f"  new count, plain / buckets: {plain_new / bucket_new:.3f}")
print(f"  plain: new / seen {plain_new / statistics.median(times['plain, seen count']):.3f}")
