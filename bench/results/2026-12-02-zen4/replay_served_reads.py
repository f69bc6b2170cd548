# ruff: noqa
import pickle, glob, statistics, sys, time
from pathlib import Path
sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache
model = load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2))
batches = [pickle.load(open(f, "rb")) for f in sorted(glob.glob("/tmp/dump/*.pkl"))]
r = batches[1]
print(len(r), "reads; prompt lens", [len(x.prompt) for x in r], "labels", [tuple(len(l) for l in x.labels) for x in r][:3])
common = 0
while all(len(x.prompt) > common and x.prompt[common] == r[0].prompt[common] for x in r): common += 1
print("shared prefix", common)
head = tuple(range(100, 130)); seeds = iter(range(200, 1 << 30))
def synth():
    reads = make_reads(model.token_limit, 510, 8, 40, seed=next(seeds))
    return [ReadSpec(id=x.id, prompt=head + x.prompt, labels=x.labels) for x in reads]
e1 = TreeEngine(model, prefix_cache=PrefixCache(2048 << 20))
e1.run(batches[0])
t_real, t_syn = [], []
for i in range(1, len(batches)):
    b = e1.run(batches[i]); t_real.append((round(b.forward_seconds, 3), b.forward_passes, b.packed_tokens))
    b = e1.run(synth()); t_syn.append((round(b.forward_seconds, 3), b.forward_passes, b.packed_tokens))
print("real (s, passes, tokens)", t_real); print("synthetic", t_syn)
