"""Forward-time benchmark of the engines: N reads sharing one long prompt head, tree vs fork vs naive.
Run: python server/bench/reads_bench.py MODEL_DIR [--head 512] [--reads 8] [--runs 5] [--threads 2] [--profile]"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from decision_server.engines import ForkEngine, NaiveEngine, ReadSpec, TreeEngine
from decision_server.model import LoadOptions, load_model
from decision_server.prefix_cache import PrefixCache


def make_reads(vocab: int, head: int, reads: int, tail: int, seed: int, tail_seed: int = 0) -> list[ReadSpec]:
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (head,), generator=generator).tolist()
    labels = tuple((int(token),) for token in torch.randint(0, vocab, (4,), generator=generator))
    if tail_seed:
        generator = torch.Generator().manual_seed(tail_seed)
    return [
        ReadSpec(
            id=index,
            prompt=tuple(shared + torch.randint(0, vocab, (tail,), generator=generator).tolist()),
            labels=labels,
        )
        for index in range(reads)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--head", type=int, default=512, help="shared prompt tokens")
    parser.add_argument("--tail", type=int, default=24, help="per-read question tokens")
    parser.add_argument("--reads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--profile", action="store_true", help="end with torch.profiler's op table of one tree run")
    args = parser.parse_args()

    model = load_model(args.model_dir, LoadOptions(dtype=args.dtype, threads=args.threads))
    reads = make_reads(model.token_limit, args.head, args.reads, args.tail, seed=0)
    unique = args.head + args.reads * args.tail
    print(
        f"{args.reads} reads, {args.head}-token shared head + {args.tail}-token tails ({unique} unique tokens), "
        f"{torch.get_num_threads()} threads, {model.device_name}, {args.dtype}"
    )
    results = {}
    for engine in (TreeEngine(model), ForkEngine(model), NaiveEngine(model)):
        engine.run(reads[:1])  # warm-up
        seconds = []
        for _ in range(args.runs):
            started = time.perf_counter()
            batch = engine.run(reads)
            wall = time.perf_counter() - started
            seconds.append(batch.forward_seconds)
        results[engine.name] = batch
        print(
            f"{engine.name:>5}: forward median {statistics.median(seconds) * 1e3:8.1f} ms "
            f"(min {min(seconds) * 1e3:.1f}, max {max(seconds) * 1e3:.1f}; last wall {wall * 1e3:.1f} ms), "
            f"{batch.forward_passes} pass(es), {batch.packed_tokens} tokens fed"
        )
    cached = TreeEngine(model, prefix_cache=PrefixCache(512 << 20))
    cached.run(reads)  # caches the shared head (and these tails)
    seconds = []
    for run in range(args.runs):
        # Same state, new questions: the head comes from the cache, only the new tails are computed.
        fresh = make_reads(model.token_limit, args.head, args.reads, args.tail, seed=0, tail_seed=run + 1)
        batch = cached.run(fresh)
        seconds.append(batch.forward_seconds)
    print(
        f"tree + prefix cache, cached head, new tails: forward median {statistics.median(seconds) * 1e3:.1f} ms, "
        f"{batch.packed_tokens} tokens fed, {sum(o.tokens_cached for o in batch.outcomes)} cached"
    )
    single = TreeEngine(model)
    seconds = []
    for _ in range(args.runs):
        seconds.append(single.run([ReadSpec(id=0, prompt=tuple(range(unique)), labels=((1,),))]).forward_seconds)
    print(f"bound: one plain prefill over {unique} tokens: median {statistics.median(seconds) * 1e3:.1f} ms")
    for name in ("tree", "fork"):
        worst = max(
            abs(a - b)
            for x, y in zip(results[name].outcomes, results["naive"].outcomes, strict=True)
            for a, b in zip(x.label_logprobs, y.label_logprobs, strict=True)
        )
        print(f"max |{name} - naive| label logprob: {worst:.2e}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        tree = TreeEngine(model)
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            batch = tree.run(reads)
        print(f"profiled tree run: {batch.forward_seconds * 1e3:.1f} ms forward, {batch.packed_tokens} tokens fed")
        print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))


if __name__ == "__main__":
    main()
