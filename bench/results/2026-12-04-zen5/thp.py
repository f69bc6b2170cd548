# ruff: noqa  (a lab script, kept as it was run; see README.md here)
import os, statistics, sys
from pathlib import Path
import torch
sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import make_engine
from decision_server.model import LoadOptions, load_model
from decision_server.serve import warm_up
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=os.environ.get("DTYPE", "bfloat16"), compile_mode="auto", matmul="auto"))
e = make_engine("auto", model, "auto")
warm_up(model, e)
ts = []
for i in range(7):
    b = e.run(make_reads(model.token_limit, 540, 8, 40, seed=900 + i)); ts.append(b.forward_seconds * 1e3)
huge = sum(int(l.split()[1]) for l in open(f"/proc/{os.getpid()}/smaps_rollup") if l.startswith("AnonHugePages"))
print(os.environ.get("THP_MEM_ALLOC_ENABLE", "0"), [round(x) for x in ts[1:]], "median", round(statistics.median(ts[1:])), "AnonHuge MB", huge // 1024)
