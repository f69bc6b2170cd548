"""Whether batching requests costs the shard's read code anything: N requests (8 questions each over their own
520-token state after a shared 12-token head, 40-token tails) in one `TreeReads.run`, then N others one by one.
Run: python batched_vs_one_by_one.py MODEL_DIR N (server/ installed or on PYTHONPATH)."""

import sys
import time
from pathlib import Path

import torch
from decision_server import layers
from decision_server.model import LoadOptions, load_model
from decision_server.reads import ReadSpec, TreeReads

model = load_model(Path(sys.argv[1]), LoadOptions(dtype="auto", matmul=layers.resolve_matmul("auto")))
requests = int(sys.argv[2])
generator = torch.Generator().manual_seed(3)
vocab = model.token_limit
head = torch.randint(0, vocab, (12,), generator=generator).tolist()
labels = tuple((int(t),) for t in torch.randint(0, vocab, (4,), generator=generator))


def request(index: int) -> list[ReadSpec]:
    state = torch.randint(0, vocab, (520,), generator=generator).tolist()
    return [
        ReadSpec(
            id=index * 8 + q,
            prompt=tuple(head + state + torch.randint(0, vocab, (40,), generator=generator).tolist()),
            labels=labels,
        )
        for q in range(8)
    ]


tree = TreeReads(model)
tree.run(request(99)[:2])  # warm-up
for turn in range(2):
    batch = [read for i in range(requests) for read in request(turn * 100 + i)]
    started = time.perf_counter()
    outcome = tree.run(batch)
    batched = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(requests):
        tree.run(request(turn * 100 + 50 + i))
    single = time.perf_counter() - started
    print(
        f"round {turn}: {requests} requests batched {batched:.1f} s ({outcome.forward_passes} passes, "
        f"{outcome.packed_tokens} tokens), one by one {single:.1f} s, batched/single {batched / single:.3f}"
    )
