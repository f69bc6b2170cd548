"""The shard's own decoder between two attentions as one compiled call (torch.compile, inductor).

Eagerly, a decoder layer is dozens of small ops: two RMSNorms, the QKV GEMM and its split, the q/k norms, the rotary
products, the output projection, a residual add, the gate/up GEMM, the gated activation, the down GEMM, another add.
On a GPU each is a kernel launch and its host work; the 2026-12-04 H200 profile spent 108 ms of host time for
10.5 ms of GPU time on one read. Here everything from one layer's attention output to the next layer's queries,
keys and values (out projection, residual, norm, gated MLP, residual, next norm, QKV, q/k norms, rotary) is one
compiled graph, and attention runs between two calls, eagerly, with the decoder's own kernels (its metadata, the
segments of a packed batch, changes every pass). That is the piecewise shape vLLM compiles and captures, and the
shape CUDA graphs can replay per token-count bucket.

One graph serves every layer: the weights are arguments, not constants, so the graph is compiled once per model
shape (and token dimension, which is dynamic), not once per layer. A plain weight is multiplied inside the graph
(`F.linear`); a weight the CPU's `--matmul` mode packed or split (`layers.HeldWeight`), which the compiler cannot
take as an argument, is held in a table here and stands in the graph as its slot number (a 0-d int64 tensor), read
by one opaque op (`decision::held_linear`) that runs `layers.matmul` on it, so every `--matmul` mode keeps its
GEMM. Applies at world size 1 (the row-parallel all-reduce stays eager at larger worlds) on passes of unpadded rows
(the AMX row buckets stay eager). Compiling needs a C++ compiler on CPU (triton on CUDA); where the probe at
load fails, the decoder runs eagerly and the shard logs why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from decision_server.layers import HeldWeight, matmul

logger = logging.getLogger(__name__)

# Passes shorter than this run eagerly: one or a few rows would specialise graphs of their own for no gain.
MIN_TOKENS = 2


# The packed or split weights the graphs multiply through `held_linear`, by slot (a weight is never dropped: a model
# is loaded once per shard process).
_HELD: list[HeldWeight] = []


def hold(weight: HeldWeight) -> torch.Tensor:
    """`weight` as a graph argument: itself where it is a plain tensor, else its slot in `_HELD` (0-d int64)."""
    if isinstance(weight, torch.Tensor) and not weight.is_mkldnn:
        return weight
    _HELD.append(weight)
    return torch.tensor(len(_HELD) - 1, dtype=torch.int64)


@torch.library.custom_op("decision::held_linear", mutates_args=())
def held_linear(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    """`x @ W.T` for the held weight W in `slot` (`layers.matmul`: oneDNN's packed GEMM, the split GEMM, ...)."""
    return matmul(x, _HELD[int(slot)])


@held_linear.register_fake
def _held_linear_shape(x: torch.Tensor, slot: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    if weight.dtype == torch.int64:
        product = held_linear(x, weight, out_features)
        return product if bias is None else product + bias
    return F.linear(x, weight, bias)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors as the compiled graph takes them (None where the model has no such tensor)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None

    def entering(self) -> tuple[torch.Tensor | None, ...]:
        return (self.input_norm, self.qkv, self.qkv_bias, self.q_norm, self.k_norm)

    def leaving(self) -> tuple[torch.Tensor | None, ...]:
        return (self.out, self.out_bias, self.post_norm, self.gate_up, self.gate_up_bias, self.down, self.down_bias)


@dataclass(frozen=True)
class LayerShape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    hidden_size: int
    intermediate: int  # this rank's MLP features


class LayerGraph:
    """The compiled pieces of one model: `enter` (the first layer's norm, QKV, q/k norms and rotary), `step` (one
    layer's output projection and MLP, then the next layer's entry) and `leave` (the last layer's exit, every row).

    Queries come out (heads, tokens, head_dim), keys and values (kv_heads, tokens, head_dim), as the decoder's
    attention takes them; `attended` goes in token-major (tokens, heads * head_dim), as the output projection takes it.
    """

    def __init__(
        self,
        shape: LayerShape,
        layers: list[LayerWeights],
        act: Callable[[torch.Tensor], torch.Tensor],
        rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        self.shape = shape
        self.layers = layers
        heads, kv_heads, head_dim, eps = shape.heads, shape.kv_heads, shape.head_dim, shape.eps
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        hidden_size, intermediate = shape.hidden_size, shape.intermediate

        def project(x: torch.Tensor, norm: Any, qkv: Any, qkv_bias: Any, q_norm: Any, k_norm: Any, cos: Any, sin: Any):
            x = torch.rms_norm(x, (x.shape[-1],), norm, eps)
            packed = _linear(x, qkv, qkv_bias, q_size + 2 * kv_size)
            tokens = packed.shape[0]
            query = packed[:, :q_size].view(tokens, heads, head_dim)
            key = packed[:, q_size : q_size + kv_size].view(tokens, kv_heads, head_dim)
            value = packed[:, q_size + kv_size :].view(tokens, kv_heads, head_dim)
            if q_norm is not None:
                query = torch.rms_norm(query, (head_dim,), q_norm, eps)
                key = torch.rms_norm(key, (head_dim,), k_norm, eps)
            # Token-major out (the callers transpose, a view): a (heads, tokens, ...) output's layout would depend
            # on whether tokens equals heads, and the graph would guard on that and compile again at such a count.
            return rotate(query, cos, sin), rotate(key, cos, sin), value

        def finish(
            hidden: torch.Tensor,
            attended: Any,
            out: Any,
            out_bias: Any,
            post: Any,
            gate_up: Any,
            gu_bias: Any,
            down: Any,
            down_bias: Any,
        ) -> torch.Tensor:
            hidden = hidden + _linear(attended, out, out_bias, hidden_size)
            normed = torch.rms_norm(hidden, (hidden.shape[-1],), post, eps)
            gate, up = _linear(normed, gate_up, gu_bias, 2 * intermediate).chunk(2, -1)
            return hidden + _linear(act(gate) * up, down, down_bias, hidden_size)

        def step(hidden: torch.Tensor, attended: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *weights: Any):
            hidden = finish(hidden, attended, *weights[:7])
            return (hidden, *project(hidden, *weights[7:], cos, sin))

        def enter(hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *weights: Any):
            return project(hidden, *weights, cos, sin)

        self._enter = torch.compile(enter, dynamic=None)
        self._step = torch.compile(step, dynamic=None)
        self._leave = torch.compile(finish, dynamic=None)
        # The eager twin of `_leave`, for the load-time probe's comparison.
        self.eager_leave = finish

    def enter(
        self, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _dynamic_tokens(hidden, cos, sin)
        return _heads_major(self._enter(hidden, cos, sin, *self.layers[index].entering()))

    def step(
        self, index: int, hidden: torch.Tensor, attended: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer `index`'s exit and layer `index + 1`'s entry: (hidden, query, key, value)."""
        _dynamic_tokens(hidden, attended, cos, sin)
        hidden, *projected = self._step(
            hidden, attended, cos, sin, *self.layers[index].leaving(), *self.layers[index + 1].entering()
        )
        return (hidden, *_heads_major(projected))

    def leave(self, index: int, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        _dynamic_tokens(hidden, attended)
        return self._leave(hidden, attended, *self.layers[index].leaving())


class LayerRun:
    """One pass through the compiled pieces, as the decoder's layer loop walks it: `projected` gives the current
    layer's queries, keys and values (heads-major), `advance` takes its attention output to the next layer's entry
    (or, after the last layer, its exit), `rows` the hidden rows. `step_graphs.GraphedRun` walks the same way with
    the pieces replayed as CUDA graphs."""

    def __init__(self, graph: LayerGraph, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.graph, self.hidden, self.cos, self.sin = graph, hidden, cos, sin
        self.query, self.key, self.value = graph.enter(0, hidden, cos, sin)

    def projected(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.query, self.key, self.value

    def advance(self, index: int, attended: torch.Tensor) -> None:
        if index < len(self.graph.layers) - 1:
            self.hidden, self.query, self.key, self.value = self.graph.step(
                index, self.hidden, attended, self.cos, self.sin
            )
        else:
            self.hidden = self.graph.leave(index, self.hidden, attended)

    def rows(self) -> torch.Tensor:
        return self.hidden


def _heads_major(projected: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    query, key, value = projected
    return query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)


def _dynamic_tokens(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)


def build(
    shape: LayerShape,
    layers: list[LayerWeights],
    act: Callable[[torch.Tensor], torch.Tensor],
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
) -> LayerGraph | None:
    """A `LayerGraph`, compiled and checked against eager torch at load on a few rows, or None (logged) where
    inductor cannot build here."""
    started = time.perf_counter()
    graph = LayerGraph(shape, layers, act, rotate)
    try:
        _probe(graph, dtype, device)
    except Exception as err:  # any failure to build means eager, said once
        logger.warning(
            "compile auto: inductor cannot compile the decoder's layers here; they run eagerly (--compile off "
            "silences this)",
            extra={"fields": {"error": f"{type(err).__name__}: {err}"[:500]}},
        )
        return None
    logger.info(
        "compile auto: the decoder's layers run as compiled graphs between attentions",
        extra={"fields": {"compile_seconds": round(time.perf_counter() - started, 2), "layers": len(layers)}},
    )
    return graph


def _probe(graph: LayerGraph, dtype: torch.dtype, device: torch.device) -> None:
    """Compiles the three pieces at two token counts (so the token dimension is dynamic from the start, and a
    served pass never compiles) and checks that the compiled step matches its eager twin closely."""
    shape = graph.shape
    hidden_size = shape.hidden_size
    width = shape.heads * shape.head_dim
    generator = torch.Generator().manual_seed(0)
    for tokens in (17, 9):
        # Built under inference mode, as a served pass's tensors are: the graphs guard on it.
        with torch.inference_mode():
            hidden = torch.randn(tokens, hidden_size, generator=generator).to(device=device, dtype=dtype)
            attended = torch.randn(tokens, width, generator=generator).to(device=device, dtype=dtype)
            cos = torch.ones(tokens, shape.head_dim, device=device, dtype=dtype)
            sin = torch.zeros(tokens, shape.head_dim, device=device, dtype=dtype)
            graph.enter(0, hidden, cos, sin)
            if len(graph.layers) > 1:
                graph.step(0, hidden, attended, cos, sin)
            left = graph.leave(len(graph.layers) - 1, hidden, attended)
            eager = graph.eager_leave(hidden, attended, *graph.layers[-1].leaving())
        tolerance = 1e-4 if dtype == torch.float32 else 5e-2
        if not torch.allclose(left.float(), eager.float(), rtol=tolerance, atol=tolerance):
            raise RuntimeError("the compiled layer computed other numbers than eager torch")
