# Lab script, kept as it was run for the 2026-12-02 notes (README.md beside it); run from the repository root.
# ruff: noqa
import sys, time, statistics, torch

sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import TreeEngine, ReadSpec
from decision_server.model import LoadOptions, load_model

dtype = sys.argv[2] if len(sys.argv) > 2 else "float32"
matmul = sys.argv[3] if len(sys.argv) > 3 else "exact"
from pathlib import Path

model = load_model(Path(sys.argv[1]), LoadOptions(dtype=dtype, threads=2, matmul=matmul))
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
tree = TreeEngine(model)
tree.run(reads[:2])
ts = []
for _ in range(3):
    b = tree.run(reads)
    ts.append(b.forward_seconds)
print(
    f"{dtype} {matmul}: tree forward median {statistics.median(ts) * 1e3:.0f} ms, {b.packed_tokens} tokens, passes {b.forward_passes}"
)
if "--prefill" in sys.argv:
    single = TreeEngine(model)
    ts = [single.run([ReadSpec(id=0, prompt=tuple(range(860)), labels=((1,),))]).forward_seconds for _ in range(3)]
    print(f"plain prefill 860: {statistics.median(ts) * 1e3:.0f} ms")
if "--profile" in sys.argv:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        b = tree.run(reads)
    print(f"profiled: {b.forward_seconds * 1e3:.0f} ms")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=55))
