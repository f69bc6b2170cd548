"""Two calls at the shard at once (the router's `--max-batches-at-shard 2`): the second waits on the model thread
behind the first and starts the moment it ends, both answer exactly as they would alone, and the batch log says how
long the model thread sat idle before each batch. Where the first batch is still in flight on the device when it has
started (a GPU), the second is started (planned, launched) before the first is finished, so the device never waits
for the host's planning; where it is done when it has started (CPU), it is answered before the second starts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import torch
from conftest import InProcessShard, label_logprobs, random_tokens, read_request, socket_dir

from decision_server.engines import BatchOutcome, ReadSpec, Started, make_engine
from decision_server.pb import decision_pb2_grpc
from decision_server.read_kinds.next_token import read_specs
from decision_server.service import DecisionShardService


@pytest.mark.parametrize(
    ("in_flight", "order"),
    [
        (False, ["start 0", "finish 0", "start 1", "finish 1"]),
        (True, ["start 0", "start 1", "finish 0", "finish 1"]),
    ],
    ids=["done-when-started-cpu", "in-flight-gpu"],
)
def test_a_second_call_waits_on_the_model_thread_and_starts_when_the_first_ends(
    tiny_qwen3: Any, caplog: pytest.LogCaptureFixture, in_flight: bool, order: list[str]
) -> None:
    generator = torch.Generator().manual_seed(7)
    vocab = tiny_qwen3.vocab_size
    state = random_tokens(generator, 40, vocab)
    requests = [
        read_request([(0, state + random_tokens(generator, 6, vocab), [[11], [12], [13]])], salt="first"),
        read_request(
            [(0, random_tokens(generator, 30, vocab), [[21], [22]]), (1, random_tokens(generator, 9, vocab), [[5]])],
            salt="second",
        ),
    ]
    engine = make_engine("tree", tiny_qwen3)
    alone = [make_engine("tree", tiny_qwen3).run(read_specs(request)) for request in requests]
    release, entered = threading.Event(), threading.Event()
    real_start = engine.start
    seen: list[str] = []

    def gated_start(reads: Sequence[ReadSpec]) -> Started[BatchOutcome]:
        # The first batch holds the model thread until the second call has arrived and queued behind it.
        if not entered.is_set():
            entered.set()
            assert release.wait(timeout=60)
        number = len([event for event in seen if event.startswith("start")])
        seen.append(f"start {number}")
        started = real_start(reads)

        def finish() -> BatchOutcome:
            seen.append(f"finish {number}")
            return started.finish()

        # As on a GPU, where the tree engine's passes are still queued on the device when `start` returns.
        return Started(finish, in_flight=in_flight)

    engine.start = gated_start  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger="decision_server.service")
    service = DecisionShardService(tiny_qwen3, engine)
    with socket_dir() as folder, ThreadPoolExecutor(max_workers=2) as client:
        running = InProcessShard(service, folder / "shard.sock")
        running.start()
        channel = grpc.insecure_channel(f"unix://{running.socket_path}")
        try:
            stub = decision_pb2_grpc.DecisionShardStub(channel)
            first = client.submit(stub.Read, requests[0], timeout=60)
            assert entered.wait(timeout=30)
            second = client.submit(stub.Read, requests[1], timeout=60)
            # The second call is decoded on the event loop while the first reads, and waits for the model thread.
            waiting = service._model_thread._work_queue
            deadline = time.monotonic() + 30
            while waiting.qsize() == 0:
                assert time.monotonic() < deadline, "the second call never reached the model thread's queue"
                time.sleep(0.01)
            assert not second.done()
            held_from = time.perf_counter()
            time.sleep(0.2)
        finally:
            release.set()
        try:
            answers = [first.result(), second.result()]
        finally:
            channel.close()
            running.stop()
    held_ms = (time.perf_counter() - held_from) * 1e3
    for answer, outcome in zip(answers, alone, strict=True):
        assert [label_logprobs(result) for result in answer.results] == [o.label_logprobs for o in outcome.outcomes]
    batches = [record.fields for record in caplog.records if record.getMessage() == "read batch"]
    assert len(batches) == 2
    assert batches[0]["idle_ms"] is None, "the first batch of a shard has no batch before it"
    # The second started as the first ended: its idle time is the thread's hand-over, not the 200 ms the first held.
    assert batches[1]["idle_ms"] < 20, batches[1]
    # The router's `decision_shard_idle_seconds` reads the same from the answers.
    assert answers[0].idle_micros == 0
    assert abs(answers[1].idle_micros - batches[1]["idle_ms"] * 1e3) <= 1
    assert batches[0]["run_ms"] >= batches[0]["forward_ms"]
    assert held_ms >= 200
    assert seen == order
