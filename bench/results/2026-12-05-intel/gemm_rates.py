# Lab script (2026-12-05, Intel Xeon without AMX): the decoder's four GEMM shapes at 862 rows in every mode the
# shard can run, modes taking turns (9 rounds, median): MKL float32 (`exact`), oneDNN float32 (`fast`), oneDNN
# bfloat16 and float16 over prepacked weights (`--dtype bfloat16|float16`). Run: PYTHONPATH=server .venv/bin/python THIS
# ruff: noqa
import statistics, time, torch, torch.nn.functional as F

torch.set_num_threads(2)
SHAPES = {"qkv 1024x4096": (1024, 4096), "out 2048x1024": (2048, 1024), "gate/up 1024x6144": (1024, 6144), "down 3072x1024": (3072, 1024)}
M = 862
print(torch.__version__, "mkldnn bf16:", torch.ops.mkldnn._is_mkldnn_bf16_supported(), "fp16:", torch.ops.mkldnn._is_mkldnn_fp16_supported())
for name, (k, n) in SHAPES.items():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, k, generator=g)
    w = (torch.randn(n, k, generator=g) * k**-0.5).bfloat16().float()
    fns = {"fp32 mkl": lambda: F.linear(x, w)}
    pw = torch.ops.mkldnn._reorder_linear_weight(w, None)
    fns["fp32 onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        xd, wd = x.to(dt), w.to(dt)
        pd = torch.ops.mkldnn._reorder_linear_weight(wd, None)
        fns[f"{tag} onednn"] = (lambda xd=xd, pd=pd: torch.ops.mkldnn._linear_pointwise(xd, pd, None, "none", [], ""))
    times = {key: [] for key in fns}
    for f in fns.values():
        f(); f()
    for _ in range(9):
        for key, f in fns.items():
            t0 = time.perf_counter(); f(); times[key].append(time.perf_counter() - t0)
    fl = 2 * M * k * n / 1e9
    print(name, {key: f"{fl / statistics.median(v):.0f}" for key, v in times.items()}, "GFLOP/s")
