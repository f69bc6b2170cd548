# ruff: noqa  (a lab script, kept as it was run; see README.md here)
import torch, time, statistics, torch.nn.functional as F
torch.set_num_threads(2)
def med(f, n=7):
    f(); f(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
M=862
for name,(k,n) in {"qkv":(1024,4096),"down":(3072,1024)}.items():
    x=torch.randn(M,k); w=torch.randn(n,k)*k**-0.5
    print(name, "fp32 F.linear (MKL)", round(2*M*k*n/1e9/med(lambda: F.linear(x,w))), "GF/s")
q=torch.randn(1,16,860,128); k=torch.randn(1,8,860,128); v=torch.randn(1,8,860,128)
for dt in (torch.float32, torch.bfloat16):
    qq,kk,vv=q.to(dt),k.to(dt),v.to(dt)
    t=med(lambda: F.scaled_dot_product_attention(qq,kk,vv,is_causal=True,enable_gqa=True))
    print(dt, "sdpa causal 860", round(t*1e3,2), "ms")
