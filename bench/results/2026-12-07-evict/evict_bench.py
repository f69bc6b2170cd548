"""Host time of one batch's prefix-cache work (64 requests x 8 questions: 512 matches, then 512 inserts) against a
FULL cache of `--states` states, so every insert evicts. Prints one dict: states, segments, batch_ms_median, runs."""

import argparse
import random
import statistics
import time

import torch
from decision_server.prefix_cache import PrefixCache

BYTES_PER_TOKEN = 16  # keys + values of 2 layers x 1 head x head_dim 1, float32
KEYS = torch.zeros(2, 1, 600, 1)


def provider(tokens: list[int]):
    def provide(start: int):
        length = len(tokens) - start
        return KEYS[:, :, :length].clone(), KEYS[:, :, :length].clone()

    return provide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--states", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    head = list(range(20))

    def request() -> list[list[int]]:
        state = [rng.randrange(1000, 50000) for _ in range(512)]
        return [head + state + [rng.randrange(100, 900) for _ in range(60)] for _ in range(8)]

    cache = PrefixCache(capacity_bytes=BYTES_PER_TOKEN * (20 + 512 + 8 * 60) * args.states)
    while cache.bytes_used < cache.capacity_bytes * 0.99:
        for prompt in request():
            cache.insert("", prompt, provider(prompt))
    times = []
    for _ in range(args.batches):
        batch = [prompt for _ in range(64) for prompt in request()]
        started = time.perf_counter()
        for prompt in batch:
            cache.match("", prompt[:-1])
        for prompt in batch:
            cache.insert("", prompt, provider(prompt))
        times.append((time.perf_counter() - started) * 1000)
    print(
        {
            "states": args.states,
            "segments": len(cache._segments()),
            "batch_ms_median": round(statistics.median(times), 1),
            "runs": [round(t, 1) for t in times],
        }
    )


if __name__ == "__main__":
    main()
