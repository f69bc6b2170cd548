# ruff: noqa
import statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2))
head = tuple(range(100, 130))
seeds = iter(range(200, 1 << 30))
def request():
    reads = make_reads(model.token_limit, 510, 8, 40, seed=next(seeds))
    return [ReadSpec(id=r.id, prompt=head + r.prompt, labels=r.labels) for r in reads]
e = TreeEngine(model, prefix_cache=PrefixCache(2048 << 20))
e.run(request())
ts=[]
for _ in range(int(sys.argv[3])):
    ts.append(e.run(request()).forward_seconds)
print(ts, statistics.median(ts))
