"""float32 causal chain attention on CPU, one thread: decoder._gemm_chain (64-query GEMM blocks) against one flash call,
by query width (heads x head_dim) and length. Run: .venv/bin/python bench/results/2026-12-06-layer-graph/chain_kernels.py"""
import torch, time, statistics
torch.set_num_threads(1)
from decision_server.decoder import _gemm_chain
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
def med(fn, n=30):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        s=time.perf_counter(); fn(); ts.append(time.perf_counter()-s)
    return statistics.median(ts)*1e3
for heads, kv, hd in [(4,2,16),(4,2,32),(4,2,64),(9,3,64),(16,8,128)]:
    for T in (300, 512, 860):
        q=torch.randn(T,heads,hd).transpose(0,1); k=torch.randn(kv,T,hd); v=torch.randn(kv,T,hd)
        with torch.inference_mode():
            a=med(lambda: _gemm_chain(q,k,v,hd**-0.5))
            b=med(lambda: flash(q[None],k[None],v[None],0.0,True,scale=hd**-0.5)[0])
        print(f"heads {heads} kv {kv} hd {hd} width {heads*hd} T {T}: gemm_chain {a:.3f} ms flash {b:.3f} ms  flash/gemm {b/a:.2f}", flush=True)
