# ruff: noqa
"""Lab: a float32 tree read whose lead chain is attended by batched float32 GEMMs with an exact softmax, in blocks
of BLOCK query rows per key/value head (`gemm_attention.py`'s form, 1.16-1.38x torch's float32 flash kernel alone),
against the decoder's `_causal_chain` (one flash call), taking turns in one process.
Usage: BLOCK=64 python gemm_chain_ab.py MODEL [ROUNDS]   (repository root, PYTHONPATH=server, preloads as the shard)"""

import os, statistics, sys
from pathlib import Path

import torch

sys.path.insert(0, "server/bench")
from reads_bench import make_reads

from decision_server import decoder
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model

BLOCK = int(os.environ.get("BLOCK", "64"))
plain = decoder._causal_chain


def gemm_chain(query, keys, values, scale):
    heads, tokens, d = query.shape
    kv, length, _ = keys.shape
    if query.dtype != torch.float32 or length != tokens:
        return plain(query, keys, values, scale)
    g = heads // kv
    qf = (query * scale).view(kv, g, tokens, d)
    kt = keys.transpose(1, 2)
    out = torch.empty(kv, g, tokens, d)
    tri = torch.ones(BLOCK, BLOCK, dtype=torch.bool).triu_(1)
    for r0 in range(0, tokens, BLOCK):
        r1 = min(tokens, r0 + BLOCK)
        n = r1 - r0
        s = torch.bmm(qf[:, :, r0:r1].reshape(kv, g * n, d), kt[:, :, :r1])
        s.view(kv, g, n, r1)[..., r0:].masked_fill_(tri[:n, :n], float("-inf"))
        m = s.amax(-1, keepdim=True)
        s.sub_(m).exp_()
        l = s.sum(-1, keepdim=True)
        out[:, :, r0:r1] = torch.bmm(s, values[:, :r1]).div_(l).view(kv, g, n, d)
    return out.view(heads, tokens, d)


rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
model = load_model(Path(sys.argv[1]), LoadOptions(dtype="float32", threads=2, compile_mode="auto", matmul="auto"))
tree = TreeEngine(model)
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
times = {"flash": [], "gemm": []}
for on in (False, True, False, True):
    decoder._causal_chain = gemm_chain if on else plain
    tree.run(reads)
for k in range(rounds):
    for on in (False, True) if k % 2 == 0 else (True, False):
        decoder._causal_chain = gemm_chain if on else plain
        times["gemm" if on else "flash"].append(tree.run(reads).forward_seconds)
f, g = statistics.median(times["flash"]), statistics.median(times["gemm"])
print(
    f"float32 ({model.matmul}), block {BLOCK}, {rounds} rounds, medians: flash chain {f * 1e3:.0f} ms, gemm chain {g * 1e3:.0f} ms: {f / g:.3f}x"
)
