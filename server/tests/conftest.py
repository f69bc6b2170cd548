"""Shared fixtures: the real models (built once into DECISION_CACHE_DIR by the CLI's own functions),
their plain transformers references, and an in-process gRPC shard on a temporary unix socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One intra-op thread by default: on a 2-core machine shared with compilers, OpenMP's spinning threads make
# each forward 2-15x slower than a single thread (measured); the suite's budget depends on steady timings.
torch.set_num_threads(int(os.environ.get("DECISION_TEST_THREADS", "1")))

from decision_server.engines import Engine, make_engine  # noqa: E402
from decision_server.export import export_default  # noqa: E402
from decision_server.fixtures import make_fixture  # noqa: E402
from decision_server.model import LoadedModel, LoadOptions, load_model  # noqa: E402
from decision_server.paths import default_model_dir, fixture_dir  # noqa: E402
from decision_server.pb import decision_pb2, decision_pb2_grpc  # noqa: E402
from decision_server.serve import build_server  # noqa: E402
from decision_server.service import DecisionShardService  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return export_default(default_model_dir())


@pytest.fixture(scope="session")
def tiny_qwen3_dir() -> Path:
    out = fixture_dir("tiny-qwen3", 0)
    make_fixture("tiny-qwen3", out, seed=0)
    return out


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> LoadedModel:
    return load_model(smollm2_dir, LoadOptions(dtype="float32"))


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_qwen3_dir: Path) -> LoadedModel:
    return load_model(tiny_qwen3_dir, LoadOptions(dtype="float32"))


def _reference(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    # Loaded separately from the shard's model, with transformers defaults, so the shard is checked against
    # an independent computation rather than against itself.
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_dir: Path) -> Any:
    return _reference(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_reference(tiny_qwen3_dir: Path) -> Any:
    return _reference(tiny_qwen3_dir)


def reference_logprobs(reference: Any, tokens: list[int], all_logits: bool = False) -> torch.Tensor:
    """Full-vocabulary log-probabilities of the next token after `tokens`, by a plain forward pass.

    By default the forward runs as `generate` runs a prefill (`logits_to_keep=1`: the LM head projects only the
    last position). With `all_logits` it projects every position; the BLAS kernel then differs with the row
    count, which alone moves SmolLM2's float32 logits by up to about 4e-5 (measured), with no change upstream.
    The log-softmax itself runs in float64 (as in integration-tests/reference.py): torch's float32 log_softmax is
    off by up to 2.2e-5 on SmolLM2, whose logits reach 33 (measured against float64), more than the shard's own
    error (1.5e-6), so a float32 reference would not be one.
    """
    with torch.inference_mode():
        output = reference(input_ids=torch.tensor([tokens]), logits_to_keep=0 if all_logits else 1)
    return torch.log_softmax(output.logits[0, -1].double(), dim=-1)


_chains: dict[tuple[int, tuple[int, ...], tuple[int, ...]], float] = {}


def reference_sequence_logprob(reference: Any, prompt: list[int], label: list[int]) -> float:
    """log P(label | prompt) as the chain of conditionals, one plain prefill per label prefix (memoised:
    several tests score the same labels, and each chain costs a prefill per token)."""
    key = (id(reference), tuple(prompt), tuple(label))
    if key not in _chains:
        _chains[key] = sum(
            float(reference_logprobs(reference, prompt + label[:step])[token]) for step, token in enumerate(label)
        )
    return _chains[key]


class InProcessShard:
    """The real grpc.aio server and service on a unix socket, on an event loop in a background thread."""

    def __init__(self, service: DecisionShardService, socket_path: Path) -> None:
        self.service = service
        self.socket_path = socket_path
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: grpc.aio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    async def _start(self) -> None:
        self._server = build_server(self.service, self.socket_path)
        await self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop).result(timeout=30)
        self.service.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


@contextmanager
def socket_dir() -> Iterator[Path]:
    # Unix socket paths are limited to about 107 bytes; pytest's tmp_path can be longer.
    folder = Path(tempfile.mkdtemp(prefix="ds-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def running_shard(model: LoadedModel, engine: Engine | str = "tree") -> Iterator[decision_pb2_grpc.DecisionShardStub]:
    chosen = make_engine(engine, model) if isinstance(engine, str) else engine
    with socket_dir() as folder:
        shard = InProcessShard(DecisionShardService(model, chosen), folder / "shard.sock")
        shard.start()
        channel = grpc.insecure_channel(f"unix://{shard.socket_path}")
        try:
            yield decision_pb2_grpc.DecisionShardStub(channel)
        finally:
            channel.close()
            shard.stop()


@pytest.fixture(scope="session")
def naive_outcomes() -> Callable[[LoadedModel, list[Any]], Any]:
    """Naive reads of a batch, computed once per (model, batch) for the whole session: the reference is the
    slowest thing the suite runs, and several tests compare against the same batch."""
    from decision_server.engines import NaiveEngine

    memo: dict[tuple[int, tuple[Any, ...]], Any] = {}

    def outcomes(model: LoadedModel, reads: list[Any]) -> Any:
        key = (id(model), tuple(reads))
        if key not in memo:
            memo[key] = NaiveEngine(model).run(reads)
        return memo[key]

    return outcomes


@pytest.fixture
def shard() -> Callable[..., Any]:
    """`with shard(model, "tree") as stub:` — a live in-process shard for one test (an engine name or engine)."""
    return running_shard


def grouped_read(read_id: int, prompt: list[int], groups: list[list[list[int]]], salt: str = "") -> decision_pb2.Read:
    """A next-token read whose labels are groups of variant token sequences."""
    return decision_pb2.Read(
        id=read_id,
        cache_salt=salt,
        next_token=decision_pb2.NextTokenRead(
            token_ids=prompt,
            labels=[
                decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=v) for v in group])
                for group in groups
            ],
        ),
    )


def read_request(reads: list[tuple[int, list[int], list[list[int]]]], salt: str = "") -> decision_pb2.ReadRequest:
    """Next-token reads with one variant per label group."""
    return decision_pb2.ReadRequest(
        reads=[grouped_read(read_id, prompt, [[label] for label in labels], salt) for read_id, prompt, labels in reads]
    )


def label_logprobs(result: decision_pb2.ReadResult) -> list[float]:
    """Every variant's log-probability of a next-token result, flattened in group then variant order (one per
    label for reads made by `read_request`)."""
    return [value for group in result.next_token.labels for value in group.variant_logprobs]


def greedy_token(result: decision_pb2.ReadResult) -> int:
    token: int = result.next_token.greedy_token_id
    return token


def random_tokens(generator: torch.Generator, count: int, vocab: int, low: int = 0) -> list[int]:
    values: list[int] = torch.randint(low, vocab, (count,), generator=generator).tolist()
    return values


def use_segment_kernel(monkeypatch: pytest.MonkeyPatch, model: Any, kernel: str) -> None:
    """Packed passes of `model` attend with `kernel` (`decoder.SEGMENT_KERNELS`). FlexAttention runs eagerly here:
    on CPU its compiled kernel costs a compile per shape (`flex_segments.kernel`), and test_flex_segments holds the
    compiled kernel to the same block mask; eager FlexAttention evaluates the same mask function on every pair."""
    monkeypatch.setattr(model, "segment_kernel", kernel)
    if kernel == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        from decision_server import flex_segments

        monkeypatch.setattr(flex_segments, "kernel", lambda device_type: flex_attention)
