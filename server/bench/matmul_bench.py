"""Which `--matmul` is faster on this CPU: the same tree read (N reads over one shared prompt head) on the model loaded
once per mode, the modes taking turns run by run so machine noise hits both alike.
Run: python server/bench/matmul_bench.py MODEL_DIR [--head 540] [--reads 8] [--tail 40] [--runs 4]"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from reads_bench import make_reads

from decision_server.engines import TreeEngine
from decision_server.layers import MATMUL_MODES, probe_matmul
from decision_server.model import LoadOptions, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--head", type=int, default=540, help="shared prompt tokens")
    parser.add_argument("--tail", type=int, default=40, help="per-read question tokens")
    parser.add_argument("--reads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=4, help="timed runs per mode")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    engines = {
        mode: TreeEngine(load_model(args.model_dir, LoadOptions(dtype="float32", threads=args.threads, matmul=mode)))
        for mode in MATMUL_MODES
    }
    reads = make_reads(engines["exact"].model.token_limit, args.head, args.reads, args.tail, seed=1)
    for engine in engines.values():
        engine.run(reads[:2])  # warm-up
    seconds: dict[str, list[float]] = {mode: [] for mode in engines}
    for run in range(args.runs):
        order = list(engines) if run % 2 == 0 else list(reversed(engines))
        for mode in order:
            started = time.perf_counter()
            engines[mode].run(reads)
            seconds[mode].append(time.perf_counter() - started)
    medians = {mode: statistics.median(times) for mode, times in seconds.items()}
    for mode, times in seconds.items():
        print(f"{mode:>5}: median {medians[mode]:.3f} s per batch ({', '.join(f'{t:.2f}' for t in times)})")
    for mode in MATMUL_MODES[1:]:
        print(f"exact / {mode} time: {medians['exact'] / medians[mode]:.3f}")
    config = engines["exact"].model.text_config
    probe = probe_matmul(config.hidden_size, 2 * config.intermediate_size)
    if probe is None:
        print("--matmul auto runs exact: neither oneDNN nor MKL's bfloat16 GEMM is available")
    else:
        times = ", ".join(f"{mode} {seconds * 1e3:.1f} ms" for mode, seconds in probe.seconds.items())
        print(f"--matmul auto's probe at {probe.shape}: {times}: auto runs {probe.choice}")


if __name__ == "__main__":
    main()
