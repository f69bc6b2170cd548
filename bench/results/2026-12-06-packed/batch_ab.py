"""One shard-side batch as the router sends it, timed in-process: REQUESTS requests of QUESTIONS questions over
distinct STATE-token states after a shared 30-token chat head, 4 single-token options each, through the serving
engine (`make_engine("auto", model, "auto")`: the tree engine with its auto prefix cache). Every timed batch has
fresh states, as a stream of distinct requests does. Prints one JSON line: the code's git commit, the batch shape,
the forward passes per batch and the wall seconds of each batch.
Run from a checkout: .venv/bin/python bench/results/2026-12-06-packed/batch_ab.py MODEL --requests 9 --runs 5"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import decision_server
import torch
from decision_server.engines import ReadSpec, make_engine
from decision_server.model import LoadOptions, load_model


def batch(vocab: int, requests: int, questions: int, state: int, seed: int) -> list[ReadSpec]:
    generator = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, vocab, (count,), generator=generator).tolist())

    head = tuple(range(100, 130))
    labels = ((11,), (12,), (13,), (14,))
    reads = []
    for _ in range(requests):
        body = head + tokens(state)
        reads.extend(
            ReadSpec(id=len(reads) + q, prompt=body + tokens(36) + (20, 21, 22), labels=labels)
            for q in range(questions)
        )
    return reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--requests", type=int, default=9)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--state", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    model = load_model(args.model_dir, LoadOptions(dtype=args.dtype, threads=torch.get_num_threads(), matmul="exact"))
    engine = make_engine("auto", model, "auto")
    engine.run(batch(model.token_limit, 1, 2, 64, seed=999))  # warm-up
    seconds, passes = [], []
    for run in range(args.runs):
        reads = batch(model.token_limit, args.requests, args.questions, args.state, seed=args.seed * 1000 + run)
        started = time.perf_counter()
        outcome = engine.run(reads)
        seconds.append(round(time.perf_counter() - started, 4))
        passes.append(outcome.forward_passes)
    root = Path(decision_server.__file__).resolve().parents[2]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        json.dumps(
            {
                "commit": commit.stdout.strip(),
                "dirty": bool(
                    subprocess.run(
                        ["git", "-C", str(root), "status", "--porcelain", "server"], capture_output=True, text=True
                    ).stdout.strip()
                ),
                "requests": args.requests,
                "questions": args.questions,
                "state": args.state,
                "dtype": args.dtype,
                "passes": passes,
                "seconds": seconds,
            }
        )
    )


if __name__ == "__main__":
    main()
