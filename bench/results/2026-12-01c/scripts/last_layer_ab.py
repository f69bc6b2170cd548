"""The last layer for read rows only (52191ad) against the full last layer, in one process, taking turns.
The full variant is `hidden_states` without `keep` (every row through every layer), then the kept rows.
Run: python last_layer_ab.py MODEL_DIR HEAD_TOKENS READS RUNS (tails of 40 tokens), from server/ on PYTHONPATH."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "server" / "bench"))
from decision_server import layers
from decision_server.decoder import DecoderLM
from decision_server.model import LoadOptions, load_model
from decision_server.reads import TreeReads
from reads_bench import make_reads

model = load_model(Path(sys.argv[1]), LoadOptions(dtype="auto", matmul=layers.resolve_matmul("auto")))
trimmed = DecoderLM.hidden_states


def full(self, ids, positions, mask, past, keep=None):  # type: ignore[no-untyped-def]
    hidden, new = trimmed(self, ids, positions, mask, past)
    return (hidden if keep is None else hidden.index_select(0, keep)), new


reads = make_reads(model.token_limit, int(sys.argv[2]), int(sys.argv[3]), 40, seed=0)
tree = TreeReads(model)
tree.run(reads[:1])
times: dict[str, list[float]] = {"trim": [], "full": []}
for turn in range(int(sys.argv[4])):
    for name in ("trim", "full") if turn % 2 == 0 else ("full", "trim"):
        DecoderLM.hidden_states = trimmed if name == "trim" else full  # type: ignore[method-assign]
        started = time.perf_counter()
        tree.run(reads)
        times[name].append(time.perf_counter() - started)
for name, values in times.items():
    print(name, f"median {statistics.median(values):.3f}", [f"{v:.2f}" for v in values])
print("full / trim", statistics.median(times["full"]) / statistics.median(times["trim"]))
