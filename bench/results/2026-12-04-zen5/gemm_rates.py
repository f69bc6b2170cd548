# ruff: noqa  (a lab script, kept as it was run; see README.md here)
import torch, time, statistics, torch.nn.functional as F
torch.set_num_threads(2)
shapes={"qkv":(1024,4096),"o":(2048,1024),"gate_up":(1024,6144),"down":(3072,1024)}
def med(f, n=9):
    f(); f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
for M in (862, 4096):
  for name,(k,n) in shapes.items():
    x=torch.randn(M,k); w=torch.randn(n,k)*k**-0.5
    fl=2*M*k*n/1e9
    pw=torch.ops.mkldnn._reorder_linear_weight(w,None)
    xb=x.bfloat16(); wb=w.bfloat16(); pwb=torch.ops.mkldnn._reorder_linear_weight(wb,None)
    r={"fp32 onednn":med(lambda: torch.ops.mkldnn._linear_pointwise(x,pw,None,"none",[],"")),
       "bf16 F.linear":med(lambda: F.linear(xb,wb)),
       "bf16 packed":med(lambda: torch.ops.mkldnn._linear_pointwise(xb,pwb,None,"none",[],""))}
    print(M, name, {k: round(fl/v) for k,v in r.items()}, "GF/s")
