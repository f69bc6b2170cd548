# Lab script (README.md beside it); run from the repository root: MODEL DTYPE ROUNDS [HEAD_TOKENS, default 30]
# Requests that share only a short chat head (30 tokens) and then a 510-token state of their own, 8 questions of 40
# tokens: the tree engine with a prefix cache (the head is a hit, the state's chain continues after it:
# `_causal_after_past`) against none (the whole chain from position 0 with the plain causal kernel). Alternating,
# in one process; forward seconds per request, medians.
# ruff: noqa
import statistics, sys
from pathlib import Path

import torch

sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server.engines import ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache

model = load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2))
HEAD = int(sys.argv[4]) if len(sys.argv) > 4 else 30
head = tuple(torch.randint(0, model.token_limit, (HEAD,), generator=torch.Generator().manual_seed(5)).tolist())
seeds = iter(range(200, 1 << 30))


def request():
    reads = make_reads(model.token_limit, 540 - HEAD, 8, 40, seed=next(seeds))
    return [ReadSpec(id=r.id, prompt=head + r.prompt, labels=r.labels) for r in reads]


engines = {"cache": TreeEngine(model, prefix_cache=PrefixCache(2048 << 20)), "none": TreeEngine(model)}
for engine in engines.values():
    engine.run(request())  # warm; the cache now holds the head
times = {name: [] for name in engines}
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 6):
    for name, engine in engines.items():
        times[name].append(engine.run(request()).forward_seconds)
c, n = statistics.median(times["cache"]), statistics.median(times["none"])
print(f"{sys.argv[2]}, {HEAD}-token head: head from the cache {c:.3f} s, no cache {n:.3f} s: cache/none {c / n:.3f}  {times}")
