"""Two real `decision-server serve` ranks (gloo on CPU) read exactly what one shard reads, as the router drives them:
every Read sent to every rank, rank 0's answer kept. A rank that dies turns the next read into an error on the
survivor, which then exits non-zero: never a hang in a collective."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import greedy_token, label_logprobs, read_request, socket_dir
from prompts import QUESTIONS, STATES, prompt_tokens
from test_tree_vs_naive import decision_batch

from decision_server.engines import ReadSpec, make_engine
from decision_server.model import LoadOptions, load_model
from decision_server.pb import decision_pb2, decision_pb2_grpc

COMMAND = [sys.executable, "-m", "decision_server.cli"]
STARTUP_TIMEOUT_S = 180.0
# Sized by the auto rule: each rank measures the free memory itself, and the ranks must agree on one budget.
PREFIX_CACHE_MB = "auto"
COLLECTIVE_TIMEOUT_S = 30
TOLERANCE = 1e-4
# The split GEMM rounds each activation to 2^-16 (`split_gemm`): another summation order on 2 ranks moves some of
# those roundings, and labels by up to 1.6e-4 (SmolLM2), where float32's own orders move them by a few 1e-6.
MODE_TOLERANCE = {"exact": TOLERANCE, "fast": TOLERANCE, "split": 5e-4}


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Rank:
    process: subprocess.Popen[bytes]
    stub: decision_pb2_grpc.DecisionShardStub
    channel: grpc.Channel
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def sharded(model_dir: Path, world_size: int = 2, read_mode: str = "tree") -> Iterator[list[Rank]]:
    """`world_size` shard processes of one group, each answering Health; stopped (or killed) afterwards."""
    port = free_port()
    with socket_dir() as folder:
        ranks: list[Rank] = []
        try:
            for index in range(world_size):
                log = Path(tempfile.mkstemp(prefix=f"rank{index}-", suffix=".log", dir=folder)[1])
                socket_path = folder / f"shard-{index}"
                process = subprocess.Popen(
                    [
                        *COMMAND,
                        "serve",
                        str(model_dir),
                        "--uds-path",
                        str(socket_path),
                        "--dtype",
                        "float32",
                        "--read-mode",
                        read_mode,
                        "--threads",
                        "1",
                        "--prefix-cache-mb",
                        str(PREFIX_CACHE_MB),
                        "--rank",
                        str(index),
                        "--world-size",
                        str(world_size),
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        str(port),
                        "--collective-timeout-secs",
                        str(COLLECTIVE_TIMEOUT_S),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=log.open("wb"),
                    env={**os.environ, "HF_HUB_OFFLINE": "1"},
                )
                channel = grpc.insecure_channel(f"unix://{socket_path}")
                ranks.append(Rank(process, decision_pb2_grpc.DecisionShardStub(channel), channel, log))
            for rank in ranks:
                _wait_healthy(rank)
            yield ranks
        finally:
            for rank in ranks:
                rank.channel.close()
                if rank.process.poll() is None:
                    rank.process.send_signal(signal.SIGTERM)
            for rank in ranks:
                try:
                    rank.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    rank.process.kill()
                    rank.process.wait()


def _wait_healthy(rank: Rank) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if rank.process.poll() is not None:
            raise AssertionError(f"rank exited with {rank.process.returncode}:\n{rank.log_text()}")
        try:
            rank.stub.Health(decision_pb2.HealthRequest(), timeout=5)
            return
        except grpc.RpcError:
            time.sleep(0.25)
    raise AssertionError(f"rank not healthy within {STARTUP_TIMEOUT_S}s:\n{rank.log_text()}")


def read_all(ranks: list[Rank], request: decision_pb2.ReadRequest, timeout: float = 120) -> decision_pb2.ReadResponse:
    """What the router does: the same Read to every rank at once; every rank must answer the same."""
    with ThreadPoolExecutor(max_workers=len(ranks)) as pool:
        futures = [pool.submit(rank.stub.Read, request, timeout=timeout) for rank in ranks]
        responses = [future.result() for future in futures]
    for other in responses[1:]:
        assert [label_logprobs(r) for r in other.results] == [label_logprobs(r) for r in responses[0].results]
        assert [greedy_token(r) for r in other.results] == [greedy_token(r) for r in responses[0].results]
    first: decision_pb2.ReadResponse = responses[0]
    return first


def _request(reads: list[ReadSpec], salt: str = "") -> decision_pb2.ReadRequest:
    return read_request([(r.id, list(r.prompt), [list(label) for label in r.labels]) for r in reads], salt=salt)


def _requests(model_dir: Path) -> list[decision_pb2.ReadRequest]:
    """Reads of every shape, in an order that exercises the prefix cache: a single read (a plain causal prefill),
    a mixed batch (shared prefixes, single- and multi-token labels), the same batch again (now cached), a cached
    state with new questions, and a salted batch that must share nothing."""
    batch = decision_batch(model_dir)
    single = ReadSpec(id=1, prompt=batch[0].prompt, labels=tuple(label for label in batch[0].labels))
    follow_up = [
        ReadSpec(id=50 + i, prompt=(*batch[i].prompt[:-3], *batch[i].prompt[-2:]), labels=batch[i].labels)
        for i in range(3)
    ]
    return [
        _request([single]),
        _request(batch),
        _request(batch),
        _request(follow_up),
        _request(batch[:4], salt="tenant-b"),
    ]


def _max_difference(one: decision_pb2.ReadResponse, two: decision_pb2.ReadResponse) -> float:
    worst = 0.0
    assert [r.id for r in one.results] == [r.id for r in two.results]
    for a, b in zip(one.results, two.results, strict=True):
        assert greedy_token(a) == greedy_token(b), (a.id, greedy_token(a), greedy_token(b))
        assert (a.tokens_computed, a.tokens_cached) == (b.tokens_computed, b.tokens_cached), a.id
        assert len(label_logprobs(a)) == len(label_logprobs(b))
        worst = max([worst, *(abs(x - y) for x, y in zip(label_logprobs(a), label_logprobs(b), strict=True))])
    return worst


def _one_shard_reads(model: Any, shard: Any, requests: list[decision_pb2.ReadRequest]) -> list[Any]:
    with shard(model, make_engine("tree", model, prefix_cache_mb=PREFIX_CACHE_MB)) as stub:
        return [stub.Read(r, timeout=120) for r in requests]


def _check_two_ranks_equal_one_shard(name: str, model: Any, ranks: list[Rank], shard: Any) -> None:
    """The ranks (started with --matmul auto) read what one in-process shard reads in the mode they chose."""
    infos = [rank.stub.Info(decision_pb2.InfoRequest(), timeout=30) for rank in ranks]
    # Like with like: 2 ranks against 1 shard multiplying the same way.
    mode = infos[0].matmul
    if mode != model.matmul:
        model = load_model(model.path, LoadOptions(dtype="float32", matmul=mode))
    expected = _one_shard_reads(model, shard, _requests(model.path))
    assert [(i.world_size, i.rank) for i in infos] == [(2, 0), (2, 1)]
    assert {(i.architecture, i.vocab_size, i.engine) for i in infos} == {(model.architecture, model.vocab_size, "tree")}
    assert len({(i.prefix_cache_bytes, i.prefix_cache_rule) for i in infos}) == 1, infos
    assert infos[0].prefix_cache_bytes > 0 and infos[0].prefix_cache_rule.startswith("auto: "), infos[0]
    got = [read_all(ranks, r) for r in _requests(model.path)]
    worst = max(_max_difference(a, b) for a, b in zip(expected, got, strict=True))
    print(f"{name} ({mode}): max |1 shard - 2 shards| over {sum(len(r.results) for r in got)} reads = {worst:.3g}")
    assert worst < MODE_TOLERANCE[mode]
    # The cache served the repeated batch on both ranks alike (read_all checked that the ranks agree).
    assert sum(r.tokens_cached for r in got[2].results) > 0
    # Each rank read only its slices: together about one checkpoint (norms are read by both), each well under one.
    checkpoint_bytes = sum(file.stat().st_size for file in model.path.glob("*.safetensors"))
    read = [_logged(rank, "rank weights loaded")["checkpoint_bytes_read"] for rank in ranks]
    assert all(bytes_read < 0.6 * checkpoint_bytes for bytes_read in read), (read, checkpoint_bytes)
    assert sum(read) == pytest.approx(checkpoint_bytes, rel=0.01)
    assert [_logged(rank, "ready")["world_size"] for rank in ranks] == [2, 2]
    # --matmul auto: each rank timed its own share, and the group runs one mode.
    timed = [_logged(rank, "matmul auto: timed the float32 GEMMs on this CPU") for rank in ranks]
    assert len({record["matmul"] for record in timed}) == 1 and timed[0]["matmul"] in ("exact", "fast", "split")
    assert [_logged(rank, "model loaded")["matmul"] for rank in ranks] == [timed[0]["matmul"]] * 2


def _logged(rank: Rank, message: str) -> dict[str, Any]:
    """The first JSON log line of `rank` with this message."""
    for line in rank.log_text().splitlines():
        if not line.startswith("{"):
            continue  # native libraries (gloo) may write plain lines to stderr too
        record: dict[str, Any] = json.loads(line)
        if record.get("message") == message:
            return record
    raise AssertionError(f"no {message!r} line in\n{rank.log_text()}")


def test_two_ranks_read_what_one_shard_reads(smollm2: Any, shard: Any) -> None:
    with sharded(smollm2.path) as ranks:
        _check_two_ranks_equal_one_shard("smollm2", smollm2, ranks, shard)


def test_two_ranks_read_what_one_shard_reads_then_a_dead_rank_fails_the_next(tiny_qwen3: Any, shard: Any) -> None:
    """The same on tiny Qwen3 (q/k norms), then rank 1 is killed: the survivor answers the next read with an error,
    at once rather than after a timeout, and exits non-zero (one pair of processes for both: they start slowly)."""
    prompt = prompt_tokens(tiny_qwen3.path, STATES[0], QUESTIONS[0])
    request = read_request([(1, prompt, [[32], [33, 34]])])
    with sharded(tiny_qwen3.path) as ranks:
        _check_two_ranks_equal_one_shard("tiny_qwen3", tiny_qwen3, ranks, shard)
        ranks[1].process.send_signal(signal.SIGKILL)
        ranks[1].process.wait(timeout=30)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as failure:
            ranks[0].stub.Read(request, timeout=COLLECTIVE_TIMEOUT_S * 2)
        elapsed = time.monotonic() - started
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE, failure.value
        assert "tensor-parallel group failed" in str(failure.value.details())
        # gloo notices the closed connection at once; the collective timeout only bounds a stuck peer.
        assert elapsed < COLLECTIVE_TIMEOUT_S
        assert ranks[0].process.wait(timeout=30) == 1
        assert "unrecoverable error, stopping" in ranks[0].log_text()
