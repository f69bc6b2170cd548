"""The compiled pieces between attentions (`layer_graph`) replayed as CUDA graphs, one per layer and token-count bucket.

A compiled `step` still costs its host work on every call: dynamo's guards, inductor's wrapper, one launch per fused
kernel and GEMM. A CUDA graph replays all of a piece's launches as one. Attention stays eager between the replays (its
metadata, the segments and cached keys of a packed pass, changes every pass): the piecewise capture vLLM uses.

Graphs read and write fixed addresses, so a pass runs in static buffers sized for the largest bucket: its hidden rows
are copied in, padded with zero rows up to the smallest bucket that holds them (`bucket_for`), and every piece reads
and writes the buckets' views of those buffers. Padding rows go through the row-wise ops (norms, GEMMs, rotary) and are
never attended: attention takes the pass's rows only, as the AMX row buckets do (`decoder.Attention.forward`). A
layer's keys and values are copied out of the buffers (the next replay overwrites them; later passes of a batch and
the prefix cache keep them). A pass longer than the largest bucket runs the compiled pieces directly.

Captures are per (piece, layer, bucket): the weights are the graph's arguments, so each layer's replay is its own
graph. They share one memory pool and happen at load, largest bucket first (so the pool's blocks serve the smaller
ones), until CAPTURE_BUDGET_S is spent; `captured` says which buckets are served. A probe at load compares a graphed
pass with the compiled pass it replaces, and the shard falls back to the compiled pieces (logged) where they differ or
capture fails.

`capture` is how a piece becomes a replay: `cuda_capture` on CUDA; CPU has no graphs, so there `replay_eagerly` calls
the piece itself, which lets CI run the same buffers, padding and copies that the graphs run on a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from decision_server import choices

if TYPE_CHECKING:
    from decision_server.layer_graph import LayerGraph

logger = logging.getLogger(__name__)

CUDA_GRAPH_MODES = choices.CUDA_GRAPH_MODES

# Token counts a pass is padded to. Steps of about 1.5x between 256 and 4,096 keep the padding under a third of a
# pass; past 4,096 tokens a pass's GPU time dwarfs its host work (issue 43: host time <= 10 % of GPU time there), so
# the compiled pieces serve it without a graph.
BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

# The most seconds capturing may take at load; buckets not reached in it are served by the compiled pieces.
CAPTURE_BUDGET_S = 60.0

Replay = Callable[[], None]
Capture = Callable[[Callable[[], None]], Replay]


def bucket_for(tokens: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding `tokens` rows, or None where none does."""
    for bucket in buckets:
        if tokens <= bucket:
            return bucket
    return None


def replay_eagerly(piece: Callable[[], None]) -> Replay:
    """A "capture" that replays by calling the piece again: the graph path's buffers and copies without graphs."""
    return piece


@dataclass
class _Pool:
    """The memory pool and side stream every capture of one model shares."""

    handle: Any = None
    stream: Any = None


def cuda_capture(pool: _Pool) -> Capture:
    """Captures pieces as CUDA graphs in `pool`: each piece runs once on a side stream first (its kernels are then
    built and its allocations warm), then is recorded."""

    def capture(piece: Callable[[], None]) -> Replay:
        if pool.stream is None:
            pool.stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        pool.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(pool.stream):
            piece()
        torch.cuda.current_stream().wait_stream(pool.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool.handle, stream=pool.stream):
            piece()
        if pool.handle is None:
            pool.handle = graph.pool()
        return graph.replay

    return capture


@dataclass
class StepGraphs:
    """One model's static buffers and its captured replays: `enter` (layer 0's entry), `step` of every layer but the
    last (its exit and the next layer's entry) and `leave` (the last layer's exit), per bucket."""

    graph: LayerGraph
    buckets: tuple[int, ...]
    capture: Capture
    hidden: torch.Tensor = field(init=False)
    attended: torch.Tensor = field(init=False)
    cos: torch.Tensor = field(init=False)
    sin: torch.Tensor = field(init=False)
    query: torch.Tensor = field(init=False)
    key: torch.Tensor = field(init=False)
    value: torch.Tensor = field(init=False)
    # Buckets whose every piece is captured, ascending: the ones a pass may use.
    captured: tuple[int, ...] = ()
    _replays: dict[tuple[str, int, int], Replay] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shape, layer = self.graph.shape, self.graph.layers[0]
        rows = max(self.buckets)
        dtype, device = layer.input_norm.dtype, layer.input_norm.device
        with torch.inference_mode():
            self.hidden = torch.zeros(rows, shape.hidden_size, dtype=dtype, device=device)
            self.attended = torch.zeros(rows, shape.heads * shape.head_dim, dtype=dtype, device=device)
            self.cos = torch.ones(rows, shape.head_dim, dtype=dtype, device=device)
            self.sin = torch.zeros(rows, shape.head_dim, dtype=dtype, device=device)
            self.query = torch.zeros(rows, shape.heads, shape.head_dim, dtype=dtype, device=device)
            self.key = torch.zeros(rows, shape.kv_heads, shape.head_dim, dtype=dtype, device=device)
            self.value = torch.zeros_like(self.key)

    def capture_all(self, budget_s: float = CAPTURE_BUDGET_S) -> tuple[int, ...]:
        """Captures every piece of every bucket, largest bucket first, until `budget_s` is spent (the bucket under
        way completes); returns (and keeps in `captured`) the buckets fully captured."""
        started = time.perf_counter()
        done: list[int] = []
        with torch.inference_mode():
            for bucket in sorted(self.buckets, reverse=True):
                self._capture_bucket(bucket)
                done.append(bucket)
                if time.perf_counter() - started > budget_s:
                    break
        self.captured = tuple(sorted(done))
        return self.captured

    def _capture_bucket(self, bucket: int) -> None:
        last = len(self.graph.layers) - 1
        self._replays[("enter", 0, bucket)] = self.capture(self._enter_piece(bucket))
        for index in range(last):
            self._replays[("step", index, bucket)] = self.capture(self._step_piece(index, bucket))
        self._replays[("leave", last, bucket)] = self.capture(self._leave_piece(last, bucket))

    def _enter_piece(self, bucket: int) -> Callable[[], None]:
        def piece() -> None:
            query, key, value = self.graph.enter(0, self.hidden[:bucket], self.cos[:bucket], self.sin[:bucket])
            self._keep_projected(bucket, query, key, value)

        return piece

    def _step_piece(self, index: int, bucket: int) -> Callable[[], None]:
        def piece() -> None:
            hidden, query, key, value = self.graph.step(
                index, self.hidden[:bucket], self.attended[:bucket], self.cos[:bucket], self.sin[:bucket]
            )
            self.hidden[:bucket].copy_(hidden)
            self._keep_projected(bucket, query, key, value)

        return piece

    def _leave_piece(self, index: int, bucket: int) -> Callable[[], None]:
        def piece() -> None:
            self.hidden[:bucket].copy_(self.graph.leave(index, self.hidden[:bucket], self.attended[:bucket]))

        return piece

    def _keep_projected(self, bucket: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        # The pieces give (heads, tokens, head_dim); the buffers are token-major, as the compiled pieces' outputs.
        self.query[:bucket].transpose(0, 1).copy_(query)
        self.key[:bucket].transpose(0, 1).copy_(key)
        self.value[:bucket].transpose(0, 1).copy_(value)

    def bucket(self, tokens: int) -> int | None:
        """The captured bucket a pass of `tokens` rows runs in, or None (the compiled pieces serve it)."""
        return bucket_for(tokens, self.captured)

    def run(self, bucket: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> GraphedRun:
        """A pass in `bucket` rows: its rows copied into the buffers, zero rows after them up to `bucket`, and layer
        0's entry replayed."""
        tokens = hidden.shape[0]
        self.hidden[:tokens].copy_(hidden)
        self.hidden[tokens:bucket].zero_()
        self.cos[:tokens].copy_(cos)
        self.sin[:tokens].copy_(sin)
        self._replays[("enter", 0, bucket)]()
        return GraphedRun(self, bucket, tokens)


@dataclass
class GraphedRun:
    """One pass through the replays, walked as `layer_graph.LayerRun` is (the decoder's one layer loop)."""

    graphs: StepGraphs
    bucket: int
    tokens: int

    def projected(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The current layer's queries (a view, read before the next replay) and its keys and values (copies, which
        outlive it), each (heads, tokens, head_dim)."""
        graphs, tokens = self.graphs, self.tokens
        query = graphs.query[:tokens].transpose(0, 1)
        return query, graphs.key[:tokens].transpose(0, 1).clone(), graphs.value[:tokens].transpose(0, 1).clone()

    def advance(self, index: int, attended: torch.Tensor) -> None:
        """Layer `index`'s exit from its attention output `attended` (tokens, heads * head_dim), then the next
        layer's entry; after the last layer, its exit only. The result stays in the buffers (`rows`)."""
        graphs = self.graphs
        graphs.attended[: attended.shape[0]].copy_(attended)
        piece = "leave" if index == len(graphs.graph.layers) - 1 else "step"
        graphs._replays[(piece, index, self.bucket)]()

    def rows(self) -> torch.Tensor:
        """The hidden rows of the pass (a view of the buffer: read it before the next pass)."""
        return self.graphs.hidden[: self.tokens]


def build(
    graph: LayerGraph,
    mode: str,
    device: torch.device,
    max_tokens: int | None = None,
    capture: Capture | None = None,
) -> StepGraphs | None:
    """The model's step graphs, captured (`capture_all`), or None where they do not apply: `mode` "off", a device
    without CUDA graphs (unless a `capture` is given: tests on CPU), or a capture that fails (logged). `max_tokens`
    (the batch budget) drops the buckets no pass can reach."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return None
    if capture is None:
        if device.type != "cuda":
            return None
        capture = cuda_capture(_Pool())
    buckets = BUCKETS
    if max_tokens is not None:
        reach = bucket_for(max_tokens, BUCKETS)
        buckets = tuple(b for b in BUCKETS if reach is None or b <= reach)
    started = time.perf_counter()
    try:
        graphs = StepGraphs(graph, buckets, capture)
        graphs.capture_all()
    except Exception as err:  # any failure to capture: the compiled pieces serve every pass
        logger.warning(
            "cuda graphs: capture failed; the compiled layers run without graphs (--cuda-graphs off silences this)",
            extra={"fields": {"error": f"{type(err).__name__}: {err}"[:500]}},
        )
        return None
    logger.info(
        "cuda graphs: the layers between attentions replay as graphs",
        extra={
            "fields": {
                "buckets": list(graphs.captured),
                "capture_seconds": round(time.perf_counter() - started, 2),
                "layers": len(graph.layers),
            }
        },
    )
    return graphs
