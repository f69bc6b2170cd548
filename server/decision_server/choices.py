"""The values of the shard's option flags, torch-free: the CLI parses its flags from them without importing torch,
and the modules that act on an option (model_base, layers, fused, architectures) take their names from here."""

from __future__ import annotations

# `--dtype`: the weights' dtype; auto is float32 on CPU and the checkpoint's half precision elsewhere
# (`model_base.resolve_dtype`).
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)

# `--read-mode`: the engines a read mode names; auto picks tree for all-attention models and fork for hybrids.
ENGINE_NAMES = ("tree", "fork", "naive")
READ_MODES = ("auto", *ENGINE_NAMES)

# `--matmul`: how linear layers multiply on CPU (`layers`): float32 modes, then the half-precision one only.
MATMUL_MODES = ("exact", "fast", "split")
HALF_MATMUL_MODES = ("exact", "widen")
MATMUL_CHOICES = ("auto", *MATMUL_MODES, "widen")

# `--compile`: whether half-precision elementwise chains are fused with torch.compile (`fused`).
COMPILE_MODES = ("auto", "off")

# `--cuda-graphs`: whether the compiled layers replay as CUDA graphs per token-count bucket (`step_graphs`).
CUDA_GRAPH_MODES = ("auto", "off")

# Every option flag of `decision-server serve` with a fixed set of values, by flag: what the launcher must accept.
SERVE_CHOICES: dict[str, tuple[str, ...]] = {
    "--dtype": DTYPE_CHOICES,
    "--read-mode": READ_MODES,
    "--matmul": MATMUL_CHOICES,
    "--compile": COMPILE_MODES,
    "--cuda-graphs": CUDA_GRAPH_MODES,
}
