# Lab script (README.md beside it): float32 GEMM modes on AMX at the gate/up shape, 1,080 rows (two 540-row halves).
# Run while the integration suite used the other core: compare within the run only.
# ruff: noqa
import torch, time
torch.set_num_threads(2)
a = torch.randn(1080, 1024); b = (torch.randn(6144, 1024) * 0.03).bfloat16().float()
ref = a.double() @ b.double().t()
def t(f, n=10):
    f(); s=time.perf_counter(); [f() for _ in range(n)]; return (time.perf_counter()-s)/n*1e3
err = lambda o: ((o.double()-ref).abs().max()/ref.abs().max()).item()
print("fp32 F.linear", t(lambda: torch.nn.functional.linear(a, b)), err(torch.nn.functional.linear(a, b)))
m = torch.backends.mkldnn.matmul
m.fp32_precision = "bf16"
p = torch.ops.mkldnn._reorder_linear_weight(b, None)
f = lambda: torch.ops.mkldnn._linear_pointwise(a, p, None, "none", [], "")
print("bf16 mode packed fp32", t(f), err(f()))
g = lambda: torch.nn.functional.linear(a, b)
print("bf16 mode F.linear", t(g), err(g()))
m.fp32_precision = "none"
print("plain packed fp32", t(f), err(f()))
ab, bb = a.bfloat16(), torch.ops.mkldnn._reorder_linear_weight(b.bfloat16(), None)
h = lambda: torch.ops.mkldnn._linear_pointwise(ab, bb, None, "none", [], "")
print("bf16 packed (bf16 out)", t(h))
