"""Host work per forward: one read of 512 tokens through a model that is deep but tiny in width (28 layers, hidden 64,
a 1,024-token vocabulary: its compute is negligible, so the wall time is the host's work per op and per layer), for
our serving path (the tree engine on the shard's own decoder, as `decision-server serve` builds it) and for
transformers' eager forward of the same weights (`logits_to_keep=1`, as a prefill). Also counts the ops our path
launches per layer (torch.profiler: aten ops on CPU, kernels on CUDA).

Prints one JSON object: ours_ms, transformers_ms (medians), ratio (ours / transformers), ops_per_layer, device.
Run: .venv/bin/python bench/host_overhead.py [--dtype bfloat16] [--runs 30]  (on CUDA where the machine has it)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

LAYERS = 28
TOKENS = 512


def build(folder: Path, dtype: torch.dtype) -> None:
    """A Qwen3-architecture checkpoint, deep and narrow, random weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(dtype).save_pretrained(folder)


def median_ms(run: Callable[[], object], runs: int, synchronize: Callable[[], None]) -> float:
    for _ in range(3):
        run()
    synchronize()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def ops_per_layer(run: Callable[[], object], device: torch.device) -> float:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
    events = prof.events()
    if cuda:
        count = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    else:
        # Top-level aten ops (those not called from inside another aten op): what dispatch pays for.
        count = sum(
            1
            for e in events
            if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        )
    return count / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--tokens", type=int, default=TOKENS, help="Tokens of the read (default 512, the issue's proxy)"
    )
    parser.add_argument("--threads", type=int, default=None)
    # The serving path's defaults (`decision-server serve`): what the target is about.
    parser.add_argument("--matmul", default="auto")
    parser.add_argument("--compile", default="auto")
    parser.add_argument("--cuda-graphs", default="auto")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    from decision_server.engines import ReadSpec, make_engine
    from decision_server.model import LoadOptions, load_model
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder, dtype)
        # The shard picks its device as serving does (CUDA where there is one).
        options = LoadOptions(
            dtype=args.dtype, matmul=args.matmul, compile_mode=args.compile, cuda_graphs=args.cuda_graphs
        )
        ours = load_model(folder, options)
        device = ours.device
        engine = make_engine("auto", ours, 0)
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    generator = torch.Generator().manual_seed(1)
    prompt = tuple(torch.randint(10, 1024, (args.tokens,), generator=generator).tolist())
    read = ReadSpec(id=0, prompt=prompt, labels=((1,), (2,), (3,), (4,)))
    ids = torch.tensor([prompt], device=device)

    def ours_read() -> object:
        return engine.run([read])

    def reference_forward() -> object:
        with torch.inference_mode():
            return reference(input_ids=ids, logits_to_keep=1).logits

    synchronize = ours.synchronize
    ours_ms = median_ms(ours_read, args.runs, synchronize)
    theirs_ms = median_ms(reference_forward, args.runs, synchronize)
    print(
        json.dumps(
            {
                "ours_ms": round(ours_ms, 3),
                "transformers_ms": round(theirs_ms, 3),
                "ratio": round(ours_ms / theirs_ms, 3),
                "ops_per_layer": round(ops_per_layer(ours_read, device), 1),
                "transformers_ops_per_layer": round(ops_per_layer(reference_forward, device), 1),
                "device": ours.device_name,
                "dtype": args.dtype,
                "tokens": args.tokens,
                "threads": torch.get_num_threads(),
                "matmul": ours.matmul,
                "compile": args.compile,
                "cuda_graph_buckets": list(ours.cuda_graph_buckets),
            }
        )
    )


if __name__ == "__main__":
    main()
