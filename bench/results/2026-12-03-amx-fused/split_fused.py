"""Tried, not shipped: `--matmul split` (float32) with its elementwise chains compiled too (rotary, gated activation
and the split's own hi/lo passes, `split_gemm.halves`, by torch.compile), against eager, taking turns in one
process: 1.050x (3,022 against 2,879 ms), and labels moved by up to 4.2e-3 on the random-weight Qwen3-0.6B shape.

    python split_fused.py MODEL        (from the repository root, PYTHONPATH=server; patches module state)
"""

# ruff: noqa
import statistics, sys, torch
from pathlib import Path
sys.path.insert(0, "server/bench")
from reads_bench import make_reads
from decision_server import fused, split_gemm
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
model = load_model(Path(sys.argv[1]), LoadOptions(dtype="float32", threads=2, matmul="split"))
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
engine = TreeEngine(model)
eager_halves = split_gemm.halves
def halves_form(x):
    hi = x.to(torch.bfloat16)
    return hi, (x - hi.float()).to(torch.bfloat16)
compiled_halves = torch.compile(halves_form, dynamic=True)
def use(on):
    fused.HALF_DTYPES = (torch.bfloat16, torch.float16, torch.float32) if on else (torch.bfloat16, torch.float16)
    fused._enabled = on
    split_gemm.halves = (lambda x: compiled_halves(x) if x.shape[0] > 1 else eager_halves(x)) if on else eager_halves
res = {}
for on in (False, True):
    use(on); res[on] = torch.tensor([p for o in engine.run(reads).outcomes for p in o.label_logprobs], dtype=torch.float64)
t = {False: [], True: []}
for _ in range(5):
    for on in (False, True):
        use(on); t[on].append(engine.run(reads).forward_seconds)
e, c = statistics.median(t[False]), statistics.median(t[True])
print(f"split eager {e*1e3:.0f} ms, fused {c*1e3:.0f} ms: {e/c:.3f}x; max |dlabel| {(res[True]-res[False]).abs().max():.2e}")
