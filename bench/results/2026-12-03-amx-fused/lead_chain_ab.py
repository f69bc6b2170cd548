"""A tree read of 8 questions over a 540-token state, planned as two passes (the state's causal pass, then the
questions' masked pass) or as one pass led by the state (`plan_passes(lead_chains=True)`), taking turns in one
process: median forward seconds of each, and their ratio.

    python lead_chain_ab.py MODEL DTYPE MATMUL [ROUNDS]      (from the repository root, PYTHONPATH=server)
"""

# ruff: noqa  (a lab script, kept as it was run)

import statistics
import sys
from pathlib import Path

sys.path.insert(0, "server/bench")
from reads_bench import make_reads  # noqa: E402

from decision_server.engines import TreeEngine  # noqa: E402
from decision_server.model import LoadOptions, load_model  # noqa: E402

model = load_model(Path(sys.argv[1]), LoadOptions(dtype=sys.argv[2], threads=2, matmul=sys.argv[3]))
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 6
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
tree = TreeEngine(model)
times: dict[bool, list[float]] = {True: [], False: []}
passes = {}
for lead in (True, False):
    model.splits_lead_chains = lambda lead=lead: lead  # type: ignore[method-assign]
    tree.run(reads)
for _ in range(rounds):
    for lead in (True, False):
        model.splits_lead_chains = lambda lead=lead: lead  # type: ignore[method-assign]
        batch = tree.run(reads)
        times[lead].append(batch.forward_seconds)
        passes[lead] = batch.forward_passes
one, two = statistics.median(times[True]), statistics.median(times[False])
print(
    f"{sys.argv[2]} {sys.argv[3]}: one pass ({passes[True]}) {one * 1e3:.0f} ms, two passes ({passes[False]}) "
    f"{two * 1e3:.0f} ms: one pass {two / one:.3f}x faster (medians of {rounds})"
)
