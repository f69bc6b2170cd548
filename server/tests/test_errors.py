"""Bad reads fail with INVALID_ARGUMENT naming the read; any other failure is a gRPC status, never a hang."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from conftest import label_logprobs, read_request

from decision_server.engines import BatchOutcome, NextTokenEngine, ReadSpec
from decision_server.model import LoadedModel
from decision_server.pb import decision_pb2

GOOD = (1, [1, 2, 3], [[4], [5, 6]])


def invalid_cases(model: LoadedModel) -> list[tuple[list[tuple[int, list[int], list[list[int]]]], str]]:
    vocab = model.token_limit
    limit = model.max_position_embeddings
    return [
        ([GOOD, (42, [], [[4]])], "read 42: prompt has no tokens"),
        ([GOOD, (43, [1, 2], [[4], []])], "read 43: label 1 has no tokens"),
        ([(44, [1, vocab], [[4]])], f"read 44: prompt token id {vocab} is out of range (vocabulary size {vocab})"),
        ([(45, [1, 2], [[4], [5, vocab + 7]])], f"read 45: label 1 token id {vocab + 7} is out of range"),
        ([(46, [1] * (limit + 1), [[4]])], f"read 46: prompt of {limit + 1} tokens exceeds max_position_embeddings"),
        ([(47, [1] * limit, [[4], [4, 5]])], f"read 47: prompt of {limit} tokens plus a label of 2 tokens exceeds"),
    ]


@pytest.mark.parametrize("mode", ["tree", "fork", "naive"])
def test_invalid_reads_are_invalid_argument(tiny_qwen3: LoadedModel, shard: Any, mode: str) -> None:
    with shard(tiny_qwen3, mode) as stub:
        for reads, message in invalid_cases(tiny_qwen3):
            with pytest.raises(grpc.RpcError) as failure:
                stub.Read(read_request(reads), timeout=60)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in failure.value.details()
        # The shard keeps serving after rejecting bad input.
        (result,) = stub.Read(read_request([GOOD]), timeout=60).results
        assert result.id == 1 and len(label_logprobs(result)) == 2


def test_prompt_at_the_position_limit_is_accepted(tiny_qwen3: LoadedModel, shard: Any) -> None:
    limit = tiny_qwen3.max_position_embeddings
    with shard(tiny_qwen3, "tree") as stub:
        (result,) = stub.Read(read_request([(9, [1] * (limit - 1), [[4], [4, 5]])]), timeout=120).results
    assert result.tokens_computed == limit - 1
    assert all(value < 0 for value in label_logprobs(result))


def shared(request: decision_pb2.ReadRequest, prefixes: list[int]) -> decision_pb2.ReadRequest:
    """`request` with each read's first `prefixes[i]` prompt tokens sent as shared with the read before it."""
    for read, prefix in zip(request.reads, prefixes, strict=True):
        whole = list(read.next_token.token_ids)
        del read.next_token.token_ids[:]
        read.next_token.token_ids.extend(whole[prefix:])
        read.next_token.shared_prefix = prefix
    return request


def test_prompts_sent_with_shared_prefixes_read_as_the_whole_prompts(tiny_qwen3: LoadedModel, shard: Any) -> None:
    """The router sends a request's state once (`NextTokenRead.shared_prefix`); the shard reads the same prompts."""
    state = list(range(5, 45))
    reads = [
        (1, [*state, 7, 8], [[4], [5, 6]]),
        (2, [*state, 7, 9], [[4]]),
        (3, [*state, 7, 9], [[5]]),
        (4, [3], [[4]]),
    ]
    with shard(tiny_qwen3, "tree") as stub:
        whole = stub.Read(read_request(reads), timeout=60).results
        sent = stub.Read(shared(read_request(reads), [0, 41, 42, 0]), timeout=60).results
    assert [label_logprobs(r) for r in sent] == [label_logprobs(r) for r in whole]
    assert [r.id for r in sent] == [1, 2, 3, 4]


def test_a_shared_prefix_without_its_tokens_is_invalid_argument(tiny_qwen3: LoadedModel, shard: Any) -> None:
    with shard(tiny_qwen3, "tree") as stub:
        for prefixes, message in (
            ([3, 0], "read 1: shared_prefix 3 with no read before it"),
            ([0, 4], "read 2: shared_prefix 4 with a previous prompt of 3 tokens"),
        ):
            request = shared(read_request([(1, [1, 2, 3], [[4]]), (2, [1, 2, 3, 4, 5], [[4]])]), [0, 0])
            for read, prefix in zip(request.reads, prefixes, strict=True):
                read.next_token.shared_prefix = prefix
            with pytest.raises(grpc.RpcError) as failure:
                stub.Read(request, timeout=60)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in failure.value.details()


def test_empty_batch_gives_empty_response(tiny_qwen3: LoadedModel, shard: Any) -> None:
    with shard(tiny_qwen3, "tree") as stub:
        response = stub.Read(decision_pb2.ReadRequest(), timeout=60)
    assert list(response.results) == []
    assert response.forward_micros == 0


class ExplodingEngine(NextTokenEngine):
    name = "exploding"

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        raise RuntimeError("kernel exploded on purpose")


def test_unexpected_failure_is_internal_with_its_message(tiny_qwen3: LoadedModel, shard: Any) -> None:
    with shard(tiny_qwen3, ExplodingEngine(tiny_qwen3)) as stub:
        with pytest.raises(grpc.RpcError) as failure:
            stub.Read(read_request([GOOD]), timeout=60)
        assert failure.value.code() == grpc.StatusCode.INTERNAL
        assert "RuntimeError: kernel exploded on purpose" in failure.value.details()
        # Validation still comes first, and the service keeps answering other RPCs.
        with pytest.raises(grpc.RpcError) as invalid:
            stub.Read(read_request([(3, [], [[1]])]), timeout=60)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert stub.Info(decision_pb2.InfoRequest(), timeout=60).engine == "exploding"


def test_non_finite_health_probe_is_an_error(
    tiny_qwen3: LoadedModel, shard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shard(tiny_qwen3, "tree") as stub:
        monkeypatch.setattr(tiny_qwen3, "probe", lambda: float("nan"))
        with pytest.raises(grpc.RpcError) as failure:
            stub.Health(decision_pb2.HealthRequest(), timeout=60)
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert "health probe on cpu returned nan" in failure.value.details()


class SlowEngine(NextTokenEngine):
    """Holds the model thread for a while, like a large batch would."""

    name = "slow"

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        import time

        from decision_server.engines import ReadOutcome

        time.sleep(2.0)
        return BatchOutcome(
            outcomes=[
                ReadOutcome(id=r.id, label_logprobs=[0.0] * len(r.labels), greedy_token_id=0, tokens_computed=0)
                for r in reads
            ]
        )


def test_health_answers_while_a_read_is_running(tiny_qwen3: LoadedModel, shard: Any) -> None:
    import time

    with shard(tiny_qwen3, SlowEngine(tiny_qwen3)) as stub:
        pending = [stub.Read.future(read_request([(i, [1, 2], [[3]])]), timeout=60) for i in range(2)]
        time.sleep(0.2)
        started = time.monotonic()
        stub.Health(decision_pb2.HealthRequest(), timeout=60)
        assert time.monotonic() - started < 1.0, "Health waited behind the running read"
        # Reads are serialised on the model thread, and every one is answered.
        assert sorted(f.result().results[0].id for f in pending) == [0, 1]


def test_status_mapping() -> None:
    import torch

    from decision_server.engines import InvalidReadError
    from decision_server.errors import grpc_status_for, is_fatal

    assert grpc_status_for(InvalidReadError(5, "prompt has no tokens")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "read 5: prompt has no tokens",
    )
    oom = torch.OutOfMemoryError("tried to allocate 8 GiB")
    assert grpc_status_for(oom)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not is_fatal(oom)
    device_fault = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert grpc_status_for(device_fault) == (grpc.StatusCode.INTERNAL, f"RuntimeError: {device_fault}")
    assert is_fatal(device_fault)
    assert not is_fatal(ValueError("shape mismatch"))
