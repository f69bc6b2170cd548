# Lab script (README.md beside it); run from the repository root.
# torch.compile (inductor's CPU C++ code generation) of the decoder's elementwise chains, in-process, against
# eager: the same tree read (8 questions x 40 tokens after a 540-token state), alternating, medians.
# ruff: noqa
import statistics, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server import decoder
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model

model = load_model(Path(sys.argv[1]), LoadOptions(dtype="float32", threads=2))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)

eager_rotate = decoder._rotate
eager_mlp = decoder.GatedMLP.forward


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :half], sin[:, None, :half]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


compiled_rotate = torch.compile(rotate, dynamic=True)


@torch.compile(dynamic=True)
def silu_mul(fused):
    gate, up = fused.chunk(2, dim=-1)
    return F.silu(gate) * up


def compiled_mlp(self, x):
    return self.down(silu_mul(self.gate_up(x)))


def use(compiled: bool):
    decoder._rotate = compiled_rotate if compiled else eager_rotate
    decoder.GatedMLP.forward = compiled_mlp if compiled else eager_mlp


engine = TreeEngine(model)
for mode in (False, True):
    use(mode)
    start = time.perf_counter()
    engine.run(reads)
    print(f"first run compiled={mode}: {time.perf_counter() - start:.1f} s")
times = {False: [], True: []}
for _ in range(rounds):
    for mode in (False, True):
        use(mode)
        times[mode].append(engine.run(reads).forward_seconds)
e, c = statistics.median(times[False]), statistics.median(times[True])
print(f"eager {e:.3f} s, compiled {c:.3f} s: {e / c:.3f}x  ({times})")
# exactness of the compiled chains against eager on one run
use(False)
a = engine.run(reads)
use(True)
b = engine.run(reads)
worst = max(abs(x - y) for ra, rb in zip(a.outcomes, b.outcomes) for x, y in zip(ra.label_logprobs, rb.label_logprobs))
print(f"max |dlogprob| compiled vs eager: {worst:.2e}")
