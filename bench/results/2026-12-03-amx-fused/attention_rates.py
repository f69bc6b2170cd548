"""Causal chain attention at Qwen3-0.6B's shapes (16 query heads, 8 key/value heads, head_dim 128) on this CPU:
torch's CPU flash kernel in float32 and bfloat16 against attention built from MKL's bfloat16 GEMM with float32 sums
(`cblas_gemm_bf16bf16f32`): 'split' (float32-grade: each float32 operand as two bfloat16 parts, three products)
and 'bf16 scores f32' (bfloat16 operands, float32 scores and softmax). Errors are against float64.

    python attention_rates.py [tokens ...]
"""

# ruff: noqa  (a lab script, kept as it was run)

import sys
import time

import torch

from decision_server import split_gemm

H, KV, D = 16, 8, 128
G = H // KV
gemm = split_gemm._gemm()
RM, N_, T_ = 101, 111, 112


def mm(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, m, n, k, trans_b, beta):
    gemm(RM, N_, T_ if trans_b else N_, m, n, k, 1.0, a.data_ptr() + 2 * a_off, lda, b.data_ptr() + 2 * b_off, ldb,
         beta, c.data_ptr() + 4 * c_off, ldc)


def gemm_attention(q, k, v, scale, split, block=128):
    """q (H, T, D), k/v (KV, T, D) float32; causal. Returns (H, T, D) float32."""
    t = q.shape[1]
    # Rows (token, head-in-group) of one key/value head, contiguous: (KV, T, G, D).
    qg = q.view(KV, G, t, D).transpose(1, 2).contiguous() * scale
    if split:
        qh, ql = split_gemm.halves(qg)
        kh, kl = split_gemm.halves(k.contiguous())
        vh, vl = split_gemm.halves(v.contiguous())
        a = torch.cat((qh, qh, ql), -1).contiguous()  # (KV, T, G, 3D)
        b = torch.cat((kh, kl, kh), -1).contiguous()  # (KV, T, 3D)
        kd = 3 * D
    else:
        a = qg.to(torch.bfloat16)
        b = k.to(torch.bfloat16).contiguous()
        vh = v.to(torch.bfloat16).contiguous()
        kd = D
    out = torch.empty(KV, t, G, D)
    positions = torch.arange(t)
    for s in range(0, t, block):
        e = min(t, s + block)
        rows = (e - s) * G
        allowed = (positions[:e] <= positions[s:e, None]).repeat_interleave(G, 0)  # (rows, e)
        for h in range(KV):
            scores = torch.empty(rows, e)
            mm(a, (h * t + s) * G * kd, kd, b, h * t * kd, kd, scores, 0, e, rows, e, kd, True, 0.0)
            scores.masked_fill_(~allowed, float("-inf"))
            p = torch.softmax(scores, -1)
            o = out[h, s:e]  # (e-s, G, D) contiguous rows
            off = (h * t + s) * G * D
            if split:
                ph, pl = split_gemm.halves(p)
                mm(ph, 0, e, vh, h * t * D, D, out, off, D, rows, D, e, False, 0.0)
                mm(ph, 0, e, vl, h * t * D, D, out, off, D, rows, D, e, False, 1.0)
                mm(pl, 0, e, vh, h * t * D, D, out, off, D, rows, D, e, False, 1.0)
            else:
                pb = p.to(torch.bfloat16)
                mm(pb, 0, e, vh, h * t * D, D, out, off, D, rows, D, e, False, 0.0)
    return out.transpose(1, 2).reshape(H, t, D)


def flash(q, k, v, scale):
    f = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return f(q[None], k[None], v[None], 0.0, True, scale=scale)[0][0]


def best(fn, rounds=7):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[0], times[len(times) // 2]


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    for t in [int(a) for a in sys.argv[1:]] or [540, 860]:
        q, k, v = torch.randn(H, t, D), torch.randn(KV, t, D), torch.randn(KV, t, D)
        scale = D**-0.5
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double()[None], k.double()[None], v.double()[None], is_causal=True, scale=scale, enable_gqa=True)[0]
        flops = 2 * 2 * H * t * t * D / 2  # causal half
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        runs = {
            "flash float32": lambda: flash(q, k, v, scale),
            "flash bfloat16": lambda: flash(qb, kb, vb, scale),
            "split (MKL bf16->f32)": lambda: gemm_attention(q, k, v, scale, True),
            "bf16 scores f32 (MKL)": lambda: gemm_attention(q, k, v, scale, False),
        }
        for name, fn in runs.items():
            error = (fn().double() - ref).abs().max().item()
            low, mid = best(fn)
            print(f"T={t:5d} {name:24s} best {low*1e3:7.2f} ms  median {mid*1e3:7.2f} ms  "
                  f"{flops/low/1e9:7.1f} GFLOP/s (causal)  max|err| vs float64 {error:.2e}")


if __name__ == "__main__":
    main()
