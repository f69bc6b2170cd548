"""W8A8 (int8 weights per output feature, int8 activations per token, integer GEMM via torch._int_mm) against
float32 on real SmolLM2 weights and the shard tests' decision prompts: which linears can be quantized and keep the
labels? Run from the repo root: .venv/bin/python bench/results/2026-12-02-per-token/int8_accuracy.py MODEL_DIR"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, "server/tests")
from decision_server.engines import TreeEngine
from decision_server.model import LoadOptions, load_model
from test_tree_vs_naive import decision_batch


def scales(rows: torch.Tensor) -> torch.Tensor:
    return rows.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0


def quantize(module: torch.nn.Module) -> None:
    weight = module.weight.data
    w_scale = scales(weight)
    values = torch.round(weight / w_scale[:, None]).to(torch.int8).t().contiguous()

    def forward(x: torch.Tensor) -> torch.Tensor:
        x_scale = scales(x)[:, None]
        out = torch.mul(torch._int_mm(torch.round(x / x_scale).to(torch.int8), values), x_scale) * w_scale
        return module.group.all_reduce_sum(out) if hasattr(module, "group") else out

    module.forward = forward


folder = Path(sys.argv[1])
reads = decision_batch(folder)
reference = TreeEngine(load_model(folder, LoadOptions(dtype="float32"))).run(reads)
for chosen in ("all", "qkv,gate_up", "qkv", "gate_up", "down", "out"):
    model = load_model(folder, LoadOptions(dtype="float32"))
    for layer in model.network.layers:
        parts = {
            "qkv": layer.attention.qkv,
            "out": layer.attention.out,
            "gate_up": layer.mlp.gate_up,
            "down": layer.mlp.down,
        }
        for name, module in parts.items():
            if chosen == "all" or name in chosen.split(","):
                quantize(module)
    batch = TreeEngine(model).run(reads)
    pairs = list(zip(batch.outcomes, reference.outcomes, strict=False))
    worst = max(abs(a - b) for o, r in pairs for a, b in zip(o.label_logprobs, r.label_logprobs, strict=False))
    top = lambda v: max(range(len(v)), key=v.__getitem__)  # noqa: E731
    agree = sum(top(o.label_logprobs) == top(r.label_logprobs) for o, r in pairs)
    print(f"int8 {chosen}: max |dlogprob| {worst:.3f}, top label agrees on {agree}/{len(reads)} reads")
