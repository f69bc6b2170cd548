# Lab script for the 2026-12-03 notes (README.md beside it); run from the repository root with either venv:
#   .venv/bin/python bench/results/2026-12-03-zen3/attention_vs_vllm.py            # ours: torch's SDPA (flash) kernel
#   $PEER/bin/python bench/results/2026-12-03-zen3/attention_vs_vllm.py            # also vLLM's cpu_attn kernel
# One layer's causal self-attention over a request's tokens at Qwen3-0.6B's heads (16 query, 8 key/value, 128 wide),
# float32, 2 threads: the call our decoder makes for a chain (F.scaled_dot_product_attention, is_causal, enable_gqa)
# and the one vLLM's CPU backend makes for a prefill (its key/value cache write and cpu_attention_with_kv_cache,
# block size 128 as it picks on this CPU). The two outputs are compared, so both time the same result.
# DTYPE=bfloat16 times both in bfloat16 (2026-12-03, Zen 4; vLLM picks the same "vec" kernel there).
# ruff: noqa
import math, os, statistics, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import median_seconds as timed  # two warm-up calls, then the median of 7

torch.set_num_threads(2)
HEADS, KV_HEADS, DIM, BLOCK = 16, 8, 128, 128
SCALE = DIM**-0.5
DTYPE = getattr(torch, os.environ.get("DTYPE", "float32"))




try:
    from vllm.platforms import current_platform
    import vllm._custom_ops as ops

    current_platform.import_kernels()
except ImportError:
    ops = None

print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {DTYPE}, vllm kernels: {ops is not None}")
for tokens in [int(t) for t in sys.argv[1:]] or (570, 860, 2048):
    g = torch.Generator().manual_seed(tokens)
    q = torch.randn(tokens, HEADS, DIM, generator=g).to(DTYPE)
    k = torch.randn(tokens, KV_HEADS, DIM, generator=g).to(DTYPE)
    v = torch.randn(tokens, KV_HEADS, DIM, generator=g).to(DTYPE)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, heads, tokens, dim), as the decoder has them

    def ours():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=SCALE, enable_gqa=True)

    reference = ours()[0].transpose(0, 1)
    flops = 4 * HEADS * DIM * tokens * (tokens + 1) / 2  # QK^T and PV over the causal half
    mine = timed(ours)
    line = f"{tokens} tokens: torch sdpa {mine * 1e3:.2f} ms ({flops / mine / 1e9:.0f} GFLOP/s)"
    if ops is not None:
        blocks = math.ceil(tokens / BLOCK)
        cache = torch.zeros(blocks, KV_HEADS, BLOCK, 2 * DIM, dtype=DTYPE)
        key_cache, value_cache = cache.view(blocks, KV_HEADS, BLOCK * 2, DIM).chunk(2, dim=2)
        slots = torch.arange(tokens, dtype=torch.int64)
        starts = torch.tensor([0, tokens], dtype=torch.int32)
        lengths = torch.tensor([tokens], dtype=torch.int32)
        table = torch.arange(blocks, dtype=torch.int32)[None]
        out = torch.empty(tokens, HEADS, DIM, dtype=DTYPE)
        isa = "vec"  # vLLM's choice for float32 at block size 128 without AMX (cpu_attn._get_attn_isa)

        def theirs():
            ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa)
            meta = ops.cpu_attn_get_scheduler_metadata(
                1, HEADS, KV_HEADS, DIM, lengths, DTYPE, starts, True, -1, isa, False
            )
            ops.cpu_attention_with_kv_cache(
                q, key_cache, value_cache, out, starts, lengths, SCALE, True, None, -1, table, 0.0, meta, None
            )
            return out

        error = float((theirs().float() - reference.float()).abs().max())
        their = timed(theirs)
        line += f" | vllm cpu_attn {their * 1e3:.2f} ms ({flops / their / 1e9:.0f} GFLOP/s), max |diff| {error:.1e}"
        line += f" | ours / theirs {mine / their:.2f}"
    print(line)
