# ruff: noqa  (a lab script, kept as it was run; see README.md here)
import os, statistics, sys
from pathlib import Path
import torch
sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import make_engine, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.serve import warm_up
th = os.environ.get("TH")
model = load_model(Path(sys.argv[1]), LoadOptions(dtype="bfloat16", compile_mode="auto", matmul="auto", threads=int(th) if th else None))
print("threads", torch.get_num_threads())
engines = {"tree": TreeEngine(model), "cache-1mb": make_engine("auto", model, 1), "cache-auto": make_engine("auto", model, "auto")}
warm_up(model, engines["cache-auto"])
for e in engines.values(): e.run(make_reads(model.token_limit, 540, 8, 40, seed=1))
res = {k: [] for k in engines}
for i in range(6):
    for k, e in engines.items():
        b = e.run(make_reads(model.token_limit, 540, 8, 40, seed=1000 + i * 10 + len(k)))
        res[k].append(b.forward_seconds * 1e3)
for k, v in res.items(): print(k, [round(x) for x in v], "median", round(statistics.median(v)))
