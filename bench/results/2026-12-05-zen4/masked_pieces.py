# ruff: noqa
"""Lab: a causal chain attended as one causal call of torch's CPU flash kernel (which computes every key of its
512-key block for every query block, so a chain under 512 tokens costs a full square), against pieces of P queries,
each ONE masked call over the keys up to its end (dense before it, causal within): no log-sum-exp merge; the waste
is P²/2 per piece. Usage: python masked_pieces.py [tokens...]   (2 threads, MKL dispatch preloaded as the shard)"""

import statistics, sys, time
import torch

torch.set_num_threads(2)
H, HKV, D = 16, 8, 128
SCALE = D**-0.5
flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def whole(q, k, v):
    return flash(q[None], k[None], v[None], 0.0, True, scale=SCALE)[0][0]


def masks(tokens, size, dtype):
    out = []
    for start in range(0, tokens, size):
        end = min(start + size, tokens)
        allowed = torch.ones(end - start, end, dtype=torch.bool).tril_(start)
        out.append(
            (start, end, torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))[None, None])
        )
    return out


def pieces(q, k, v, plan):
    parts = []
    for start, end, mask in plan:
        if start == 0:
            parts.append(flash(q[None, :, :end], k[None, :, :end], v[None, :, :end], 0.0, True, scale=SCALE)[0][0])
        else:
            parts.append(
                flash(
                    q[None, :, start:end], k[None, :, :end], v[None, :, :end], 0.0, False, attn_mask=mask, scale=SCALE
                )[0][0]
            )
    return torch.cat(parts, dim=1)


def timed(fn, n=7):
    fn()
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
for tokens in [int(t) for t in sys.argv[1:]] or (540, 860):
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(tokens)
        q = torch.randn(H, tokens, D, generator=g).to(dtype)
        k = torch.randn(HKV, tokens, D, generator=g).to(dtype)
        v = torch.randn(HKV, tokens, D, generator=g).to(dtype)
        exact = whole(q.double(), k.double(), v.double())
        runs = {"whole": lambda: whole(q, k, v)}
        for p in (128, 192, 256, 320):
            plan = masks(tokens, p, dtype)
            runs[f"pieces {p}"] = lambda plan=plan: pieces(q, k, v, plan)
        errors = {name: float((run().double() - exact).abs().max()) for name, run in runs.items()}
        times = {name: [] for name in runs}
        for _ in range(3):
            for name, run in runs.items():
                times[name].append(timed(run))
        base = statistics.median(times["whole"])
        print(
            f"{tokens} {str(dtype)[6:]}: "
            + " | ".join(
                f"{name} {statistics.median(t) * 1e3:.2f} ms ({base / statistics.median(t):.2f}x, err {errors[name]:.1e})"
                for name, t in times.items()
            ),
            flush=True,
        )
