# Lab script (threads.txt beside it); run from the repository root: MODEL DTYPE
# ruff: noqa
import sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "server/bench")
from pathlib import Path
from reads_bench import make_reads
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2))
e = TreeEngine(model)
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
e.run(reads)
pool = ThreadPoolExecutor(max_workers=1)
for _ in range(3):
    main = e.run(reads).forward_seconds
    other = pool.submit(lambda: e.run(reads).forward_seconds).result()
    print(f"main thread {main:.3f} s, worker thread {other:.3f} s")
