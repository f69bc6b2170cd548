"""Memory per rank at 1 vs N tensor-parallel shards, for real `decision-server serve` processes: weight bytes each
rank holds, checkpoint bytes it read, and its resident set size (VmRSS; VmHWM, the peak) when ready and after a read.

    python server/bench/tp_memory.py MODEL_DIR [--world-sizes 1 2] [--dtype float32] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from decision_server.pb import decision_pb2, decision_pb2_grpc


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def log_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def measure(model_dir: Path, world_size: int, dtype: str, threads: int, prompt_tokens: int) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="tpm-", dir="/tmp"))
    port = free_port()
    processes = []
    try:
        for rank in range(world_size):
            log = folder / f"rank{rank}.log"
            command = [sys.executable, "-m", "decision_server.cli", "serve", str(model_dir)]
            command += ["--uds-path", str(folder / f"s-{rank}"), "--dtype", dtype, "--threads", str(threads)]
            command += ["--rank", str(rank), "--world-size", str(world_size)]
            if world_size > 1:
                command += ["--master-port", str(port)]
            processes.append((subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb")), log))
        deadline = time.monotonic() + 600
        while not all(any(r.get("message") == "ready" for r in log_records(log)) for _, log in processes):
            for process, log in processes:
                if process.poll() is not None:
                    raise RuntimeError(f"rank exited {process.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("not ready in 600 s")
            time.sleep(0.5)
        rows = []
        for rank, (process, log) in enumerate(processes):
            records = log_records(log)
            ready = next(r for r in records if r.get("message") == "ready")
            loaded = next((r for r in records if r.get("message") == "rank weights loaded"), {})
            rows.append(
                {
                    "world_size": world_size,
                    "rank": rank,
                    "weight_bytes": ready["weight_bytes"],
                    "checkpoint_bytes_read": loaded.get("checkpoint_bytes_read"),
                    "rss_ready_mib": proc_status_kib(process.pid, "VmRSS") / 1024,
                }
            )
        # One read of `prompt_tokens` tokens on every rank at once, as the router sends it.
        request = decision_pb2.ReadRequest(
            reads=[
                decision_pb2.Read(
                    id=1,
                    next_token=decision_pb2.NextTokenRead(
                        token_ids=[(i * 7919) % 20000 + 100 for i in range(prompt_tokens)],
                        labels=[
                            decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=[32])]),
                            decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=[33, 34])]),
                        ],
                    ),
                )
            ]
        )
        channels = [grpc.insecure_channel(f"unix://{folder / f's-{rank}'}") for rank in range(world_size)]
        stubs = [decision_pb2_grpc.DecisionShardStub(channel) for channel in channels]
        for _attempt in range(2):  # the second read is the timed one
            started = time.perf_counter()
            futures = [stub.Read.future(request, timeout=600) for stub in stubs]
            results = [future.result() for future in futures]
            seconds = time.perf_counter() - started
        for row, (process, _), result in zip(rows, processes, results, strict=True):
            row["rss_after_read_mib"] = proc_status_kib(process.pid, "VmRSS") / 1024
            row["peak_rss_mib"] = proc_status_kib(process.pid, "VmHWM") / 1024
            row["read_seconds"] = round(seconds, 3)
            row["label_logprobs"] = [group.variant_logprobs[0] for group in result.results[0].next_token.labels]
        for channel in channels:
            channel.close()
        return rows
    finally:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(
        "| world size | rank | weights (MiB) | checkpoint read (MiB) | RSS ready (MiB) | RSS after read | peak RSS | ",
        end="",
    )
    print("read (s) |")
    print("|---|---|---|---|---|---|---|---|")
    first: list[float] | None = None
    differences = []
    for world_size in args.world_sizes:
        rows = measure(args.model_dir, world_size, args.dtype, args.threads, args.prompt_tokens)
        first = first or rows[0]["label_logprobs"]
        differences.append((world_size, max(abs(a - b) for a, b in zip(first, rows[0]["label_logprobs"], strict=True))))
        for row in rows:
            read_mib = (row["checkpoint_bytes_read"] or 0) / 2**20
            print(
                f"| {world_size} | {row['rank']} | {row['weight_bytes'] / 2**20:.1f} | {read_mib:.1f} | "
                f"{row['rss_ready_mib']:.0f} | {row['rss_after_read_mib']:.0f} | {row['peak_rss_mib']:.0f} | "
                f"{row['read_seconds']} |",
                flush=True,
            )
    for world_size, difference in differences[1:]:
        print(f"max |label log-prob, {world_size} ranks - {args.world_sizes[0]}|: {difference:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
