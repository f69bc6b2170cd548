# Lab script (threads.txt beside it); run from the repository root: MODEL DTYPE VARIANT (A, B or C)
# ruff: noqa
import sys, time, threading
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "server/bench")
from pathlib import Path
from reads_bench import make_reads
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
variant = sys.argv[3]
W = ThreadPoolExecutor(max_workers=1)
P = ThreadPoolExecutor(max_workers=4)
load = lambda: load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2))
model = W.submit(load).result() if variant in ("A", "C") else load()
e = TreeEngine(model)
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
W.submit(lambda: e.run(reads)).result()
out = []
for _ in range(3):
    if variant == "C":
        for _ in range(4):
            P.submit(model.probe).result()
    out.append(W.submit(lambda: e.run(reads).forward_seconds).result())
print(variant, [round(x, 3) for x in out])
