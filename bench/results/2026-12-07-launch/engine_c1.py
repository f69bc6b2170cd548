"""One request's batch (8 questions over a fresh 512-token state, tiny Qwen3, serving defaults, prefix cache 256 MiB)
through the engine alone, one thread: the thread CPU ms of engine.run, median of N. A/B by putting a worktree's
server/ first on PYTHONPATH:  PYTHONPATH=/tmp/wt-base/server .venv/bin/python engine_c1.py 80"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from decision_server import collector
from decision_server.engines import ReadSpec, make_engine
from decision_server.model import LoadOptions, load_model

torch.set_num_threads(1)
model = load_model(Path.home() / ".cache/decision-inference/models/tiny-qwen3", LoadOptions())
engine = make_engine("auto", model, 256)
generator = torch.Generator().manual_seed(0)


def batch() -> list[ReadSpec]:
    state = list(range(1, 11)) + torch.randint(20, 1000, (512,), generator=generator).tolist()
    return [
        ReadSpec(
            id=i,
            prompt=tuple(state + torch.randint(20, 1000, (40,), generator=generator).tolist()),
            labels=((3,), (4,), (7,), (9,)),
        )
        for i in range(8)
    ]


for _ in range(5):
    engine.run(batch())
collector.settle()
times = []
for _ in range(int(sys.argv[1])):
    reads = batch()
    started = time.thread_time()
    engine.run(reads)
    times.append((time.thread_time() - started) * 1000)
print(json.dumps({"median_ms": round(statistics.median(times), 2), "mean_ms": round(statistics.mean(times), 2)}))
