# ruff: noqa
"""Lab: attention of one layer (16 query heads, 8 key/value heads, 128 wide) as batched float32 GEMMs with an
exact softmax in between, blocked over query rows so a causal chain skips the blocks above the diagonal, against
torch's CPU flash kernel. Usage: python gemm_attention.py [rounds]."""

import statistics, sys, time
import torch

torch.set_num_threads(2)
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
H, HKV, D = 16, 8, 128


def gemm_attention(q, k, v, causal, scale, block):
    heads, tq, d = q.shape
    kv, tk, _ = k.shape
    g = heads // kv
    qf = (q.float() * scale).view(kv, g, tq, d)
    kt = k.float().transpose(1, 2)
    vf = v.float()
    out = torch.empty(kv, g, tq, d)
    lse = torch.empty(kv, g, tq)
    step = block if causal else tq
    tri = torch.ones(step, step, dtype=torch.bool).triu_(1)
    for r0 in range(0, tq, step):
        r1 = min(tq, r0 + step)
        n = r1 - r0
        kend = tk - tq + r1 if causal else tk
        qb = qf[:, :, r0:r1].reshape(kv, g * n, d)
        s = torch.bmm(qb, kt[:, :, :kend])
        if causal:
            s.view(kv, g, n, kend)[..., kend - n :].masked_fill_(tri[:n, :n], float("-inf"))
        m = s.amax(-1, keepdim=True)
        s.sub_(m).exp_()
        l = s.sum(-1, keepdim=True)
        o = torch.bmm(s, vf[:, :kend]).div_(l)
        out[:, :, r0:r1] = o.view(kv, g, n, d)
        lse[:, :, r0:r1] = (m + l.log()).view(kv, g, n)
    return out.view(heads, tq, d), lse.view(heads, tq)


def reference(q, k, v, causal, scale):
    g = q.shape[0] // k.shape[0]
    kk = k.double().repeat_interleave(g, 0)
    vv = v.double().repeat_interleave(g, 0)
    s = q.double() @ kk.transpose(1, 2) * scale
    if causal:
        tq, tk = q.shape[1], k.shape[1]
        s.masked_fill_(torch.ones(tq, tk, dtype=torch.bool).triu_(tk - tq + 1), float("-inf"))
    return torch.softmax(s, -1) @ vv


def timed(fn, rounds):
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
scale = D**-0.5
for dtype in (torch.bfloat16, torch.float32):
    for name, tq, tk, causal in (
        ("chain 540", 540, 540, True),
        ("chain 860", 860, 860, True),
        ("dense 320x540", 320, 540, False),
    ):
        torch.manual_seed(0)
        q, k, v = (torch.randn(h, t, D).to(dtype) for h, t in ((H, tq), (HKV, tk), (HKV, tk)))
        ref = reference(q, k, v, causal, scale)
        flops = 4 * H * tq * tk * D * (0.5 if causal else 1)
        t_flash = timed(lambda: flash(q[None], k[None], v[None], 0.0, causal, scale=scale), rounds)
        err_flash = (flash(q[None], k[None], v[None], 0.0, causal, scale=scale)[0][0].double() - ref).abs().max().item()
        line = f"{str(dtype)[6:]:9s} {name:14s} flash {t_flash:7.2f} ms ({flops / t_flash / 1e6:5.0f} GFLOP/s, err {err_flash:.1e})"
        for block in (64, 128, 256):
            t = timed(lambda: gemm_attention(q, k, v, causal, scale, block), rounds)
            err = (gemm_attention(q, k, v, causal, scale, block)[0].double() - ref).abs().max().item()
            line += f" | gemm/{block} {t:7.2f} ({t_flash / t:4.2f}x, err {err:.1e})"
            if not causal:
                break
        print(line, flush=True)
