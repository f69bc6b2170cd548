"""Where a tree read's time goes on CUDA (run by the device tool after bench/gpu-check.sh made /tmp/gpu-models, or
making the Qwen3-0.6B fixture itself): median forward of 8 reads over a 540-token head with 40-token tails, the same
tokens through transformers' own forward, and torch.profiler's tables (CPU and CUDA time) of one read."""

# ruff: noqa  (a lab script for the device machine)

import os, statistics, sys, time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server" / "bench"))
from reads_bench import make_reads
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
from transformers import AutoModelForCausalLM

folder = Path(os.environ.get("FIXTURE", "/tmp/gpu-models/qwen3-0.6b"))
model = load_model(folder, LoadOptions(dtype="bfloat16"))
tree = TreeEngine(model)
reads = make_reads(model.token_limit, 540, 8, 40, seed=1)
for _ in range(3):
    tree.run(reads)
times = []
for i in range(7):
    torch.cuda.synchronize()
    started = time.perf_counter()
    batch = tree.run(make_reads(model.token_limit, 540, 8, 40, seed=10 + i))
    torch.cuda.synchronize()
    times.append(time.perf_counter() - started)
print(f"tree read: median {statistics.median(times) * 1e3:.1f} ms, {batch.forward_passes} pass(es), {batch.packed_tokens} tokens")
reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to("cuda").eval()
ids = torch.randint(0, 1000, (1, 860), device="cuda")
with torch.inference_mode():
    for _ in range(3):
        reference(ids)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        reference(ids)
    torch.cuda.synchronize()
print(f"transformers forward of 860 tokens: {(time.perf_counter() - started) * 100:.1f} ms")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    tree.run(reads)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
