"""torch.profiler's op table of one bfloat16 tree read (8 reads over a 540-token head with 40-token tails) with the
elementwise chains compiled (`fused`, as `--compile auto` runs them) and one pass per state, as the shard runs it.

    python tree_profile_compiled.py MODEL        (from the repository root, PYTHONPATH=server, tcmalloc preloaded)

DTYPE=float32 profiles the float32 read (`--matmul auto`, nothing compiled) instead (2026-12-03, Zen 4).
"""

# ruff: noqa  (a lab script, kept as it was run)

import os
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "server/bench")
from reads_bench import make_reads  # noqa: E402

from decision_server import fused  # noqa: E402
from decision_server.engines import TreeEngine  # noqa: E402
from decision_server.model import LoadOptions, load_model  # noqa: E402

DTYPE = os.environ.get("DTYPE", "bfloat16")
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=DTYPE, threads=2, compile_mode="auto", matmul="auto"))
assert fused.enabled() or DTYPE == "float32"
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
tree = TreeEngine(model)
tree.run(reads[:2])
times = [tree.run(reads).forward_seconds for _ in range(4)]
print(f"{DTYPE} ({model.matmul if DTYPE == 'float32' else 'compiled'}): tree forward median {statistics.median(times) * 1e3:.0f} ms")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    batch = tree.run(reads)
print(f"profiled: {batch.forward_seconds * 1e3:.0f} ms, {batch.forward_passes} pass(es), {batch.packed_tokens} tokens")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=55))
