# ruff: noqa
import torch, time, statistics
torch.set_num_threads(2)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
H, KV, D = 16, 8, 128
def bench(f, n=15):
    f(); ts=[]
    for _ in range(n):
        s=time.perf_counter(); f(); ts.append(time.perf_counter()-s)
    return statistics.median(ts)*1e3
def layout(T, heads):  # (heads, T, D) views of a token-major tensor, as the decoder has them
    return torch.randn(T, heads, D).bfloat16().transpose(0, 1)
for (T, P, causal) in ((540, 0, True), (510, 30, True), (320, 540, False), (128, 0, True)):
    S = T + P if causal else P
    q = layout(T + (P if causal else 0), H)  # padded form for the causal-after-past case
    k = layout(S, KV); v = layout(S, KV)
    f_bf = lambda: flash(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, causal, scale=D**-0.5)
    f_up = lambda: flash(q.float().unsqueeze(0), k.float().unsqueeze(0), v.float().unsqueeze(0), 0.0, causal, scale=D**-0.5)[0].bfloat16()
    f_upc = lambda: flash(q.float().contiguous().unsqueeze(0), k.float().contiguous().unsqueeze(0), v.float().contiguous().unsqueeze(0), 0.0, causal, scale=D**-0.5)[0].bfloat16()
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
    f_bfc = lambda: flash(qc.unsqueeze(0), kc.unsqueeze(0), vc.unsqueeze(0), 0.0, causal, scale=D**-0.5)
    ref = flash(q.double().unsqueeze(0), k.double().unsqueeze(0), v.double().unsqueeze(0), 0.0, causal, scale=D**-0.5)[0] if False else None
    print(f"T={T} past={P} causal={causal}: bf16 {bench(f_bf):.2f} ms, bf16 contiguous {bench(f_bfc):.2f}, fp32 upcast {bench(f_up):.2f}, fp32 upcast contiguous {bench(f_upc):.2f}")
