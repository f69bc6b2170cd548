# ruff: noqa
import torch, time, statistics
torch.set_num_threads(2)
def ref(x, w, eps):
    wide = x.float(); wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps); return w * wide.to(x.dtype)
def new(x, w, eps):
    return w * torch.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
def bench(f, n=30):
    f(); ts=[]
    for _ in range(n):
        s=time.perf_counter(); f(); ts.append(time.perf_counter()-s)
    return statistics.median(ts)*1e6
for shape in ((860, 1024), (860, 16, 128), (860, 8, 128)):
    x = torch.randn(*shape).bfloat16() * 3; w = (torch.randn(shape[-1]) * 0.1 + 1).bfloat16()
    if len(shape) == 3:
        big = torch.randn(860, 4096).bfloat16(); x = big[:, :shape[1]*128].view(860, shape[1], 128)
    a, b = ref(x, w, 1e-6), new(x, w, 1e-6)
    print(shape, "equal", torch.equal(a, b), "ref us", round(bench(lambda: ref(x, w, 1e-6))), "new us", round(bench(lambda: new(x, w, 1e-6))))
