"""The DecisionShard gRPC service: protobuf reads in, the engine, protobuf results out, through the codec of the
engine's read kind (`read_kinds/`). Model work runs on one dedicated thread so the event loop keeps answering Health
while a batch computes."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from decision_server import fused
from decision_server.engines import AnyEngine, Started
from decision_server.errors import grpc_status_for, is_fatal
from decision_server.model_base import LoadedModel, dtype_name
from decision_server.pb import decision_pb2, decision_pb2_grpc
from decision_server.read_kinds import MODALITIES, read_kind_of
from decision_server.telemetry import NoTracing, ReadTracer

logger = logging.getLogger(__name__)

Reply = TypeVar("Reply")


class ProbeError(RuntimeError):
    """The health probe ran but produced a non-finite value: the device or the weights are broken."""


# Media decoding and processing run on their own threads, so they never hold up the model thread's reads.
MEDIA_THREADS = 2


def new_model_thread() -> ThreadPoolExecutor:
    """The one thread a shard runs its model work on: loading, warm-up, every read.

    Each thread that enters an OpenMP parallel region gets a team of worker threads of its own, kept for its life.
    Once libgomp manages more workers than there are CPUs it stops letting idle workers spin and puts them to sleep
    at once, so every one of a forward's hundreds of parallel regions waits for its workers to wake: the shard ran
    as if under `OMP_WAIT_POLICY=PASSIVE`. Measured (2-core Intel with AMX, Qwen3-0.6B shape, 8 questions over 540
    tokens): a tree read took 1.30-1.55 s in bfloat16 on the reads thread of a model loaded on another thread, and
    0.92-0.99 s with loading and reads on one thread (bench/results/2026-12-02-c16/threads.txt). Health probes
    (an 8 x 64 product, no parallel region) stay off this thread so a long batch never hides a live shard.
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")


class DecisionShardService(decision_pb2_grpc.DecisionShardServicer):
    def __init__(
        self,
        model: LoadedModel,
        engine: AnyEngine,
        on_fatal: Callable[[BaseException], None] | None = None,
        tracing: ReadTracer | None = None,
        model_thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self._model = model
        self._tracing: ReadTracer = tracing or NoTracing()
        self._engine = engine
        # The engine's read kind decodes every request and encodes every response (one per shard, fixed at load).
        self._kind = read_kind_of(engine)
        self._on_fatal = on_fatal
        # One thread: reads are serialised (each already uses every core) and never race on the model. `serve`
        # passes the thread that loaded the model and warmed it up (`model_thread` there says why).
        self._model_thread = model_thread or new_model_thread()
        self._media_threads = ThreadPoolExecutor(max_workers=MEDIA_THREADS, thread_name_prefix="media")
        # When the model thread last finished a batch (`time.perf_counter`), for the idle time the batch log reports.
        self._last_done: float | None = None

    def close(self) -> None:
        self._model_thread.shutdown(wait=False, cancel_futures=True)
        self._media_threads.shutdown(wait=False, cancel_futures=True)

    async def Info(
        self, request: decision_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> decision_pb2.InfoResponse:
        return await self._guard("Info", context, self._info)

    async def Health(
        self, request: decision_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> decision_pb2.HealthResponse:
        return await self._guard("Health", context, self._health)

    async def Read(
        self, request: decision_pb2.ReadRequest, context: grpc.aio.ServicerContext
    ) -> decision_pb2.ReadResponse:
        with self._tracing.read_span(context.invocation_metadata() or (), len(request.reads)):
            return await self._guard("Read", context, lambda: self._read(request))

    async def _info(self) -> decision_pb2.InfoResponse:
        model = self._model
        return decision_pb2.InfoResponse(
            architecture=model.architecture,
            vocab_size=model.vocab_size,
            max_position_embeddings=model.max_position_embeddings,
            dtype=dtype_name(model.dtype),
            device=model.device_name,
            world_size=model.world_size,
            rank=model.rank,
            engine=self._engine.name,
            matmul=model.matmul,
            implementation=model.implementation,
            modalities=[code for code, name in MODALITIES.items() if name in model.modalities],
            prefix_cache_bytes=self._engine.cache_plan.capacity_bytes,
            prefix_cache_rule=self._engine.cache_plan.rule,
            compiled_chains=fused.enabled(),
            compiled_layers=model.compiled_layers,
            segment_attention=model.segment_attention,
            cuda_graph_buckets=list(model.cuda_graph_buckets),
            batch_token_budget=self._engine.batch_budget.tokens,
            batch_budget_rule=self._engine.batch_budget.rule,
            read_kind=self._engine.read_kind,
        )

    async def _health(self) -> decision_pb2.HealthResponse:
        # Off the model thread: a long batch must not make the shard look dead to the launcher.
        probe = await asyncio.to_thread(self._model.probe)
        if not math.isfinite(probe):
            raise ProbeError(f"health probe on {self._model.device_name} returned {probe}")
        return decision_pb2.HealthResponse(probe=probe)

    async def _read(self, request: decision_pb2.ReadRequest) -> decision_pb2.ReadResponse:
        """The request decoded by the engine's read kind, its media expanded on the media threads (a read whose media
        cannot be decoded is answered with its error, the others go on), then the batch on the model thread.

        A batch the engine leaves in flight (its passes queued on a GPU: `Engine.start`) is finished in a second job on
        the model thread, so a batch that arrived meanwhile (the router's `--max-batches-at-shard 2`) is planned and
        launched first, while the device computes this one: the device then never waits for the host's planning. A
        batch that is done when it starts (CPU) is finished and answered in the same job, never held behind another."""
        engine, kind = self._engine, self._kind
        specs, media_errors = await kind.with_media(kind.from_pb(request), engine, self._media_threads)
        began: list[float] = []
        idle: list[float | None] = []

        def finish(started: Started[Any]) -> decision_pb2.ReadResponse:
            try:
                batch = started.finish()
            finally:
                self._last_done = time.perf_counter()
            waited = idle[0]
            logger.debug(
                kind.batch_message,
                extra={
                    "fields": {
                        "reads": len(batch.outcomes),
                        "forward_passes": batch.forward_passes,
                        "packed_tokens": batch.packed_tokens,
                        "forward_ms": round(batch.forward_seconds * 1e3, 3),
                        "run_ms": round((self._last_done - began[0]) * 1e3, 3),
                        "idle_ms": None if waited is None else round(waited * 1e3, 3),
                        **kind.log_fields(batch),
                    }
                },
            )
            response = kind.to_pb(specs, batch, media_errors)
            cache = engine.prefix_cache
            # The whole model's bytes on every rank (PrefixCache counts them so), for the router's usage gauge.
            response.prefix_cache_used_bytes = cache.bytes_used if cache is not None else 0
            response.idle_micros = 0 if waited is None else round(waited * 1e6)
            return response

        def start() -> decision_pb2.ReadResponse | Started[Any]:
            began.append(time.perf_counter())
            # How long the model thread (the device) sat idle before this batch: a router that keeps the next
            # batch at the shard (`--max-batches-at-shard 2`) makes it ~0 under load.
            idle.append(None if self._last_done is None else began[0] - self._last_done)
            try:
                started = engine.start(specs)
            finally:
                self._last_done = time.perf_counter()
            return started if started.in_flight else finish(started)

        loop = asyncio.get_running_loop()
        first = await loop.run_in_executor(self._model_thread, start)
        if isinstance(first, decision_pb2.ReadResponse):
            return first
        return await loop.run_in_executor(self._model_thread, finish, first)

    def _breaks_group(self, rpc: str, code: grpc.StatusCode) -> bool:
        """A rank that fails in the middle of a read leaves its peers waiting in a collective (or ahead of it by
        a pass): the group cannot go on, so with tensor parallelism such a failure stops the shard. Invalid reads
        are refused by every rank alike, before any collective."""
        return rpc == "Read" and self._model.world_size > 1 and code != grpc.StatusCode.INVALID_ARGUMENT

    async def _guard(
        self, rpc: str, context: grpc.aio.ServicerContext, handler: Callable[[], Awaitable[Reply]]
    ) -> Reply:
        try:
            return await handler()
        except Exception as exc:
            code, message = grpc_status_for(exc)
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                logger.info("rejected request", extra={"fields": {"rpc": rpc, "reason": message}})
            else:
                logger.error("rpc failed", exc_info=exc, extra={"fields": {"rpc": rpc, "code": code.name}})
            if self._on_fatal is not None and (is_fatal(exc) or self._breaks_group(rpc, code)):
                self._on_fatal(exc)
            await context.abort(code, message)
            raise  # unreachable: abort raises; keeps type checkers sure every path returns or raises
