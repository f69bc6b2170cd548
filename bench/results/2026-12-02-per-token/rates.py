"""What the lab scripts beside it share: the decoder's linear shapes (Qwen3-0.6B) and a median timer."""

import time
from collections.abc import Callable

# (in, out) features of the four linears of one Qwen3-0.6B layer (q/k/v and gate/up fused, as the shard runs them).
SHAPES = {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024)}


def median_seconds(fn: Callable[[], object], runs: int = 7) -> float:
    """The median of `runs` timed calls after two warm-up calls."""
    fn()
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[runs // 2]
