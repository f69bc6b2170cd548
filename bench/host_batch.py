"""The shard's host work per batch outside the forward pass: what the tree engine spends in Python to place, plan,
pack and account a large batch (tries, segments, score requests, the prefix cache's bookkeeping) around its one
forward. On a GPU that time is not hidden behind the forward: at issue 42's target (2,000 questions/s) a read may
cost at most 0.5 ms of host work in all, forward included.

A batch of R requests x Q questions over distinct S-token states (fresh states every run, so the prefix cache never
hits; it stores every batch as serving does), through the tree engine on a model that is narrow and shallow (Qwen3
architecture, 2 layers, hidden 64, a 1,024-token vocabulary: random weights), one thread. Times are the thread's
CPU time (steadier than wall time on a shared machine): `forward_ms` is the model's `launch` calls and the scores'
collection, `host_ms` the rest of `engine.run`. Of `host_ms`, `in_flight_ms` runs between a pass's launch and the
collection of its scores (the prefix cache's inserts: on a GPU it overlaps the device's work) and `waited_host_ms` is
the rest (the device waits for it). The heap is settled after the warm-up run as the shard settles it
(`decision_server.collector`; `--no-settle` leaves Python's defaults); `gc_ms_mean` is the time the garbage collector
ran inside `engine.run`. Means beside medians: a full collection every few batches is invisible in a median.

On CUDA the last run counts the calls that wait for the device (torch's sync debug mode): `syncs` in all,
`launch_syncs` inside the model's launch calls (a launch that waits holds the next batch's launch until the pass
before it is done) and `in_flight_syncs` between a launch and its collection (they would stall the host work meant
to overlap the pass). Both of those should be 0; the collection waits on an event, once per pass.

Prints one JSON object: reads, prompt_tokens, batch_ms, forward_ms, host_ms, in_flight_ms, waited_host_ms (medians),
batch_ms_mean, host_ms_mean, gc_ms_mean, in_flight_syncs, launch_syncs, syncs, host_us_per_read, forward_passes,
budget, device.
Run: .venv/bin/python bench/host_batch.py [--requests 64 --questions 8 --state 512 --runs 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch


def build(folder: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--state", type=int, default=512)
    parser.add_argument("--cache-mb", type=int, default=1024, help="The prefix cache (0: none)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-settle", action="store_true", help="Python's collector defaults (no freeze)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from decision_server import collector
    from decision_server.engines import ReadSpec, make_engine
    from decision_server.model import LoadOptions, load_model

    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        model = load_model(Path(tmp), LoadOptions(dtype="float32"))
    collecting = [0.0, 0.0]  # seconds collected inside engine.run, when the current collection started

    def on_collection(phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if phase == "start":
            collecting[1] = time.perf_counter()
        else:
            collecting[0] += time.perf_counter() - collecting[1]

    gc.callbacks.append(on_collection)
    # The whole batch as one chunk: what a device budget packs into one pass.
    tokens_per_request = args.state + 10 + args.questions * 18
    engine = make_engine("auto", model, args.cache_mb, max_batch_tokens=args.requests * tokens_per_request)
    # forward[0]: the model's launch and collect calls; forward[1]: host work between a launch and its collect (on a
    # GPU it runs while the device computes); forward[2]: when the last launch returned.
    forward = [0.0, 0.0, 0.0]
    # On CUDA, torch's sync debug mode warns at every call that waits for the device; those between a launch and its
    # collect would stall the host work that should overlap the pass (there should be none).
    cuda = model.device.type == "cuda"
    synced: list[warnings.WarningMessage] = []
    # warnings seen when the last launch returned; waits inside windows; waits inside launches
    window = [0, 0, 0]
    launch = model.launch

    def timed_launch(request):  # type: ignore[no-untyped-def]
        started, before = time.thread_time(), len(synced)
        try:
            launched = launch(request)
        finally:
            forward[2] = time.thread_time()
            forward[0] += forward[2] - started
            window[0] = len(synced)
            window[2] += window[0] - before
        collect = launched.collect

        def timed_collect():  # type: ignore[no-untyped-def]
            began = time.thread_time()
            forward[1] += began - forward[2]
            window[1] += len(synced) - window[0]
            try:
                return collect()
            finally:
                forward[0] += time.thread_time() - began

        launched.collect = timed_collect
        return launched

    model.launch = timed_launch  # type: ignore[method-assign]
    generator = torch.Generator().manual_seed(0)
    head = list(range(1, 11))  # a chat head every request shares

    def batch() -> list[ReadSpec]:
        reads: list[ReadSpec] = []
        for _ in range(args.requests):
            state = head + torch.randint(20, 1000, (args.state,), generator=generator).tolist()
            for _ in range(args.questions):
                question = torch.randint(20, 1000, (18,), generator=generator).tolist()
                reads.append(ReadSpec(id=len(reads), prompt=tuple(state + question), labels=((3,), (4,), (7, 8))))
        return reads

    totals, forwards, in_flights, collections, passes = [], [], [], [], 0
    for run in range(args.runs + 1):
        reads = batch()
        if run == 1 and not args.no_settle:
            collector.settle()  # after the warm-up run, as `serve` settles after its warm-up read
        forward[0] = forward[1] = collecting[0] = 0.0
        started = time.thread_time()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda and run == args.runs:  # the last run: its waits for the device, where they happen
                torch.cuda.set_sync_debug_mode("warn")
                synced = caught
            try:
                outcome = engine.run(reads)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        elapsed = time.thread_time() - started
        if run:  # the first run warms up
            totals.append(elapsed * 1000)
            forwards.append(forward[0] * 1000)
            in_flights.append(forward[1] * 1000)
            collections.append(collecting[0] * 1000)
            passes = outcome.forward_passes
    reads_n = args.requests * args.questions
    hosts = [t - f for t, f in zip(totals, forwards, strict=True)]
    host = statistics.median(hosts)
    print(
        json.dumps(
            {
                "reads": reads_n,
                "prompt_tokens": sum(len(r.prompt) for r in reads),
                "batch_ms": round(statistics.median(totals), 1),
                "forward_ms": round(statistics.median(forwards), 1),
                "host_ms": round(host, 1),
                "in_flight_ms": round(statistics.median(in_flights), 1),
                # CUDA only: the device waits in the last run while a pass was in flight (0 expected), and in all.
                "in_flight_syncs": window[1] if cuda else None,
                "launch_syncs": window[2] if cuda else None,
                "syncs": len(synced) if cuda else None,
                "waited_host_ms": round(statistics.median(h - f for h, f in zip(hosts, in_flights, strict=True)), 1),
                "batch_ms_mean": round(statistics.mean(totals), 1),
                "host_ms_mean": round(statistics.mean(hosts), 1),
                "gc_ms_mean": round(statistics.mean(collections), 1),
                "settled": not args.no_settle,
                "host_us_per_read": round(1000 * host / reads_n, 1),
                "forward_passes": passes,
                "budget": engine.batch_budget.tokens,
                "device": model.device_name,
            }
        )
    )


if __name__ == "__main__":
    main()
