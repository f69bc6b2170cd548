"""bfloat16 tree reads with the elementwise chains compiled (`fused`, `--compile auto`) against eager
(`--compile off`), taking turns in one process: median forward seconds of each and their ratio; and how far
each one's label log-probabilities land from the float32 model's on the same reads (max and mean |delta|).

    python fused_ab.py MODEL [ROUNDS]        (from the repository root, PYTHONPATH=server)
"""

# ruff: noqa  (a lab script, kept as it was run)

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, "server/bench")
from reads_bench import make_reads  # noqa: E402

from decision_server import fused  # noqa: E402
from decision_server.engines import TreeEngine  # noqa: E402
from decision_server.model import LoadOptions, load_model  # noqa: E402

path = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
model = load_model(path, LoadOptions(dtype="bfloat16", threads=2))
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
engine = TreeEngine(model)


def labels(outcomes):
    return torch.tensor([p for outcome in outcomes for p in outcome.label_logprobs], dtype=torch.float64)


def use(compiled: bool) -> None:
    if compiled:
        assert fused.enable("auto", torch.bfloat16, torch.device("cpu"))
    else:
        fused.disable()


results = {}
for compiled in (False, True):
    use(compiled)
    results[compiled] = labels(engine.run(reads).outcomes)
times: dict[bool, list[float]] = {False: [], True: []}
for _ in range(rounds):
    for compiled in (False, True):
        use(compiled)
        times[compiled].append(engine.run(reads).forward_seconds)
eager, compiled = statistics.median(times[False]), statistics.median(times[True])
print(f"{path.name} bfloat16: eager {eager * 1e3:.0f} ms, compiled {compiled * 1e3:.0f} ms: {eager / compiled:.3f}x (medians of {rounds})")
fused.disable()
reference = labels(TreeEngine(load_model(path, LoadOptions(dtype="float32", threads=2))).run(reads).outcomes)
for name, got in (("eager", results[False]), ("compiled", results[True])):
    delta = (got - reference).abs()
    print(f"  {name:8s} bfloat16 vs float32 labels: max |d| {delta.max():.4f}, mean |d| {delta.mean():.5f} ({len(delta)} labels)")
delta = (results[True] - results[False]).abs()
print(f"  compiled vs eager bfloat16: max |d| {delta.max():.4f}, mean |d| {delta.mean():.5f}")
