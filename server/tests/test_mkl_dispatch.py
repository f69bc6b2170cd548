"""MKL's kernels in a shard: with the launcher's libdecision_mkl_dispatch.so preloaded (`--mkl-dispatch`, built by
`make install` next to the launcher) MKL chooses them by the CPU's instruction sets on every vendor, and the products
it computes that way (the float32 GEMM of `--matmul exact`, torch's CPU attention in float32 and bfloat16) stay as
exact as the generic ones. Each case runs in a subprocess, since a preload only takes effect at process start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decision_server.layers import MatmulProbe, _probe_key

LIBRARY = Path(sys.executable).parent / "libdecision_mkl_dispatch.so"
INTEL = "GenuineIntel" in Path("/proc/cpuinfo").read_text()

# Float32 GEMM and attention against float64, and bfloat16 attention against float64 on the same bfloat16 inputs.
PRODUCTS = """
import json, torch, torch.nn.functional as F
from decision_server.layers import mkl_kernels
torch.manual_seed(0)
x, w = torch.randn(300, 1024), torch.randn(2048, 1024) * 1024**-0.5
gemm = (F.linear(x, w) - F.linear(x.double(), w.double())).abs().max().item()
q, k, v = torch.randn(1, 16, 300, 128), torch.randn(1, 8, 300, 128), torch.randn(1, 8, 300, 128)
def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
want = attention(q.double(), k.double(), v.double())
f32 = (attention(q, k, v) - want).abs().max().item()
qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
bf16 = (attention(qb, kb, vb).double() - attention(qb.double(), kb.double(), vb.double())).abs().max().item()
print(json.dumps({"kernels": mkl_kernels(), "gemm": gemm, "f32": f32, "bf16": bf16}))
"""


def products(preload: bool) -> dict[str, object]:
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = str(LIBRARY)
    run = subprocess.run([sys.executable, "-c", PRODUCTS], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL")


def test_make_install_puts_the_library_next_to_the_launcher() -> None:
    assert LIBRARY.is_file(), f"{LIBRARY} is missing: `make install` builds it (mkl-dispatch/)"
    assert (LIBRARY.parent / "decision-launcher").is_file()


def test_the_preloaded_library_makes_mkl_choose_by_instruction_sets_and_its_products_stay_exact() -> None:
    plain, preloaded = products(preload=False), products(preload=True)
    # Without it MKL's own vendor check decides; with it every CPU gets the kernels its instruction sets allow.
    assert plain["kernels"] == ("instruction sets" if INTEL else "generic"), plain
    assert preloaded["kernels"] == "instruction sets", preloaded
    for case in (plain, preloaded):
        # Float32 sums of 1024 products of unit-sized numbers: float32 rounding, nothing coarser.
        assert case["gemm"] < 2e-5, case
        assert case["f32"] < 1e-5, case
        # bfloat16 attention rounds its probabilities and output to bfloat16 (about 2^-8 relative).
        assert case["bf16"] < 2e-2, case


def test_the_matmul_probe_record_keys_on_mkls_kernels() -> None:
    """`--matmul auto` keeps its fastest times per key: a shard with MKL's generic kernels (half the float32 GEMM
    speed on AMD) must not decide by times a preloaded shard measured, nor the other way round."""
    key = _probe_key(MatmulProbe(seconds={"exact": 1.0}, shape=(64, 1024, 1024)))
    assert f"| MKL {'instruction sets' if INTEL else 'generic'} |" in key, key
