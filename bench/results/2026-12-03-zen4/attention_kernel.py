# Lab script (README.md beside it): builds attention_kernel.cpp (g++ -O3 -march=native, torch's cpp_extension) and
# compares it with torch's CPU flash kernel, the call the decoder makes, at a tree read's attention shapes on
# Qwen3-0.6B's heads (16 query, 8 key/value, 128 wide), one layer, 2 threads, float32 and bfloat16:
#   chain: a 540-token causal state; dense: 320 question tokens over those 540; after: 45 tokens causal after 540.
# Errors against a float64 softmax; times are medians of alternating runs.
#   PYTHONPATH=server .venv/bin/python bench/results/2026-12-03-zen4/attention_kernel.py
# ruff: noqa
import os, statistics, sys, time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import median_seconds as timed

torch.set_num_threads(2)
here = Path(__file__).parent
build = Path(os.environ.get("BUILD", "/tmp/attention_kernel_build"))
build.mkdir(parents=True, exist_ok=True)
started = time.perf_counter()
# g++ directly: torch's `load` wants ninja, which the locked environment does not carry.
import importlib.util, subprocess, sysconfig
from torch.utils import cpp_extension

library = build / "lab_attention.so"
source = here / "attention_kernel.cpp"
if not library.exists() or library.stat().st_mtime < source.stat().st_mtime:
    flags = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    links = [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    subprocess.run(["g++", "-O3", "-march=native", "-shared", "-fPIC", "-std=c++20", "-fopenmp", "-DTORCH_EXTENSION_NAME=lab_attention",
                    "-D_GLIBCXX_USE_CXX11_ABI=1", *flags, str(source), "-o", str(library), *links], check=True)
spec = importlib.util.spec_from_file_location("lab_attention", library)
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
print(f"built in {time.perf_counter() - started:.1f} s; torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
H, KV, D = 16, 8, 128
SCALE = D**-0.5
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def reference(q, k, v, offset):
    q64, k64, v64 = (x.double() for x in (q, k, v))
    k64, v64 = k64.repeat_interleave(H // KV, 0), v64.repeat_interleave(H // KV, 0)
    s = q64 @ k64.transpose(1, 2) * SCALE
    if offset >= 0:
        visible = torch.arange(q.shape[1])[:, None] + offset >= torch.arange(k.shape[1])[None, :]
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, -1) @ v64, torch.logsumexp(s, -1)


def torch_flash(q, k, v, offset):
    if offset < 0:
        return flash(q[None], k[None], v[None], 0.0, False, scale=SCALE)[:2]
    if offset == 0:
        return flash(q[None], k[None], v[None], 0.0, True, scale=SCALE)[:2]
    visible = torch.arange(q.shape[1])[:, None] + offset >= torch.arange(k.shape[1])[None, :]
    return flash(q[None], k[None], v[None], 0.0, False, attn_mask=visible[None, None], scale=SCALE)[:2]


cases = {"chain 540": (540, 540, 0), "dense 320 x 540": (320, 540, -1), "chain 860": (860, 860, 0)}
for dtype in (torch.float32, torch.bfloat16):
    for name, (t, s, offset) in cases.items():
        g = torch.Generator().manual_seed(t + s)
        # As the decoder holds them: heads-major views of token-major projections.
        q = torch.randn(t, H, D, generator=g).to(dtype).transpose(0, 1)
        k = torch.randn(s, KV, D, generator=g).to(dtype).transpose(0, 1)
        v = torch.randn(s, KV, D, generator=g).to(dtype).transpose(0, 1)
        exact, exact_lse = reference(q, k, v, offset)
        ours, ours_lse = ext.attention(q, k, v, offset, SCALE)
        theirs = torch_flash(q, k, v, offset)[0][0].double()
        err = float((ours.double() - exact).abs().max())
        err_lse = float((ours_lse.double() - exact_lse).abs().max())
        err_t = float((theirs - exact).abs().max())
        runs = {"torch": lambda: torch_flash(q, k, v, offset), "kernel": lambda: ext.attention(q, k, v, offset, SCALE)}
        times = {n: [] for n in runs}
        for _ in range(3):
            for n, run in runs.items():
                times[n].append(timed(run))
        a, b = statistics.median(times["torch"]), statistics.median(times["kernel"])
        pairs = t * s - (t * (t - 1) // 2 if offset >= 0 else 0)
        flops = 4 * H * D * pairs
        print(f"{str(dtype)[6:]:9} {name:22} torch {a*1e3:7.2f} ms ({flops/a/1e9:4.0f} GFLOP/s, err {err_t:.1e}) | kernel {b*1e3:7.2f} ms ({flops/b/1e9:4.0f} GFLOP/s, err {err:.1e}, lse {err_lse:.1e}) | {a/b:.2f}x")
