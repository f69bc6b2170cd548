# Lab script (2026-12-03, Intel AMX): MKL float32, oneDNN float32, MKL bfloat16 -> float32 and the split GEMM at the
# decoder's four shapes (862 rows), with each one's max error against float64. Run: .venv/bin/python THIS
# ruff: noqa
import torch, time, ctypes, torch.nn.functional as F, os
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent.parent / "2026-12-02-per-token"))
from rates import SHAPES as shapes, median_seconds  # two warm-up calls, then the median
torch.set_num_threads(2)
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
g = lib.cblas_gemm_bf16bf16f32
g.restype=None
g.argtypes=[ctypes.c_int]*3+[ctypes.c_int]*3+[ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
def gemm(a, w, out, beta=0.0):
    m,k=a.shape; n=w.shape[0]
    g(101,111,112,m,n,k,1.0,a.data_ptr(),k,w.data_ptr(),k,beta,out.data_ptr(),n)
def t(f): return median_seconds(f, runs=9)
M=862
for name,(k,n) in shapes.items():
    gg=torch.Generator().manual_seed(0)
    x=torch.randn(M,k,generator=gg); w=(torch.randn(n,k,generator=gg)*k**-0.5).bfloat16()
    wf=w.float(); fl=2*M*k*n/1e9
    out=torch.empty(M,n)
    xb=x.bfloat16()
    r={}
    r["fp32 mkl"]=t(lambda: F.linear(x,wf))
    pw=torch.ops.mkldnn._reorder_linear_weight(wf,None)
    r["fp32 onednn"]=t(lambda: torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],""))
    r["mkl bf16bf16f32 1x"]=t(lambda: gemm(xb,w,out))
    def split():
        hi=x.bfloat16(); lo=(x-hi.float()).bfloat16()
        gemm(hi,w,out); gemm(lo,w,out,1.0)
        return out
    r["split2"]=t(split)
    def split_cat():
        hi=x.bfloat16(); lo=(x-hi.float()).bfloat16()
        a=torch.cat([hi,lo],1)
        m_,k2=a.shape
        g(101,111,112,m_,n,k2,1.0,a.data_ptr(),k2,wcat.data_ptr(),k2,0.0,out.data_ptr(),n)
    wcat=torch.cat([w,w],1).contiguous()
    r["split2 cat-K"]=t(split_cat)
    ref=x.double()@wf.double().T
    y=split().clone(); yf=F.linear(x,wf); yo=torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],"")
    e=lambda v:(v.double()-ref).abs().max().item()
    print(name, f"err split2 {e(y):.2e} mkl {e(yf):.2e} onednn {e(yo):.2e}")
    print(name, {a:f"{fl/b:.0f}" for a,b in r.items()}, "GF/s (split: effective per original GEMM)")
