# Lab script (2026-12-03, Intel AMX): torch's oneDNN paths: float32, prepacked bfloat16 (bfloat16 out) and float32 with
# fp32_precision="bf16" (converts per call), at the decoder's four shapes. Run: .venv/bin/python THIS
# ruff: noqa
import torch, time, torch.nn.functional as F
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import SHAPES as shapes, median_seconds  # two warm-up calls, then the median
torch.set_num_threads(2)
def t(f): return median_seconds(f, runs=7)
M=862
for name,(k,n) in shapes.items():
    g=torch.Generator().manual_seed(0)
    x=torch.randn(M,k,generator=g); w=(torch.randn(n,k,generator=g)*k**-0.5).bfloat16().float()
    fl=2*M*k*n/1e9
    r={}
    r["fp32 mkl"]=t(lambda: F.linear(x,w))
    pw=torch.ops.mkldnn._reorder_linear_weight(w,None)
    r["fp32 onednn"]=t(lambda: torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],""))
    wb=w.bfloat16(); pwb=torch.ops.mkldnn._reorder_linear_weight(wb,None); xb=x.bfloat16()
    r["bf16 packed (bf16 out)"]=t(lambda: torch.ops.mkldnn._linear_pointwise(xb,pwb,None,"none",[],""))
    torch.backends.mkldnn.matmul.fp32_precision="bf16"
    r["fp32 F.linear precision=bf16"]=t(lambda: F.linear(x,w))
    try:
        r["fp32 packed precision=bf16"]=t(lambda: torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],""))
        pw2=torch.ops.mkldnn._reorder_linear_weight(w,None)
        r["fp32 packed-under-bf16 precision=bf16"]=t(lambda: torch.ops.mkldnn._linear_pointwise(x,pw2,None,"none",[],""))
        y=torch.ops.mkldnn._linear_pointwise(x,pw2,None,"none",[],"")
        ref=x.double()@w.double().T
        print(name,"err bf16-precision packed", (y-ref).abs().max().item(), "dtype", y.dtype)
    except Exception as e: print(e)
    torch.backends.mkldnn.matmul.fp32_precision="none"
    print(name, {a:f"{fl/b:.0f} GF/s" for a,b in r.items()})
