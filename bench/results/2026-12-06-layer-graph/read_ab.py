"""A/B of one process: SmolLM2 float32 read through the tree engine, eager layers vs compiled layers, interleaved."""
import sys, time, statistics, torch
from pathlib import Path
from decision_server.engines import ReadSpec, make_engine
from decision_server.model import load_model
path = Path("/root/.cache/decision-inference/models/SmolLM2-135M-Instruct")
matmul = sys.argv[1] if len(sys.argv) > 1 else "exact"
a = load_model(path, dtype="float32", matmul=matmul)
b = load_model(path, dtype="float32", matmul=matmul, compile_mode="auto")
assert b.network.graph is not None and a.network.graph is None
g = torch.Generator().manual_seed(3)
state = tuple(torch.randint(100, 40000, (int(sys.argv[3]) if len(sys.argv) > 3 else 512,), generator=g).tolist())
reads = [ReadSpec(id=i, prompt=state + tuple(torch.randint(100, 40000, (6,), generator=g).tolist()), labels=((28,), (29,), (30, 31))) for i in range(8)]
ea, eb = make_engine("auto", a, 0), make_engine("auto", b, 0)
ra, rb = ea.run(reads), eb.run(reads)
diff = max(abs(x - y) for oa, ob in zip(ra.outcomes, rb.outcomes) for x, y in zip(oa.label_logprobs, ob.label_logprobs))
print("max |logprob diff|", diff)
ta, tb = [], []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 8):
    s = time.perf_counter(); ea.run(reads); ta.append(time.perf_counter() - s)
    s = time.perf_counter(); eb.run(reads); tb.append(time.perf_counter() - s)
ma, mb = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
print(f"matmul {a.matmul}: eager {ma:.1f} ms, compiled {mb:.1f} ms, speedup {ma/mb:.3f}x")
