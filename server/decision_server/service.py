"""The DecisionShard gRPC service: protobuf in, read strategy, protobuf out.
Model work runs on one dedicated thread so the event loop keeps answering Health while a batch computes."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from decision_server.errors import grpc_status_for, is_fatal
from decision_server.model import LoadedModel, dtype_name
from decision_server.pb import decision_pb2, decision_pb2_grpc
from decision_server.reads import BatchOutcome, ReadSpec, ReadStrategy

logger = logging.getLogger(__name__)

Reply = TypeVar("Reply")


class ProbeError(RuntimeError):
    """The health probe ran but produced a non-finite value: the device or the weights are broken."""


def read_specs(request: decision_pb2.ReadRequest) -> list[ReadSpec]:
    return [
        ReadSpec(
            id=read.id,
            prompt=tuple(read.token_ids),
            labels=tuple(tuple(label.token_ids) for label in read.labels),
            cache_salt=read.cache_salt,
        )
        for read in request.reads
    ]


def read_response(batch: BatchOutcome) -> decision_pb2.ReadResponse:
    return decision_pb2.ReadResponse(
        results=[
            decision_pb2.ReadResult(
                id=outcome.id,
                label_logprobs=outcome.label_logprobs,
                greedy_token_id=outcome.greedy_token_id,
                tokens_computed=outcome.tokens_computed,
                tokens_cached=outcome.tokens_cached,
            )
            for outcome in batch.outcomes
        ],
        forward_micros=round(batch.forward_seconds * 1e6),
    )


class DecisionShardService(decision_pb2_grpc.DecisionShardServicer):
    def __init__(
        self,
        model: LoadedModel,
        strategy: ReadStrategy,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._model = model
        self._strategy = strategy
        self._on_fatal = on_fatal
        # One thread: reads are serialised (each already uses every core) and never race on the model.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reads")

    def close(self) -> None:
        self._model_thread.shutdown(wait=False, cancel_futures=True)

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
            read_mode=self._strategy.name,
            matmul=model.matmul,
        )

    async def _health(self) -> decision_pb2.HealthResponse:
        # Off the model thread: a long batch must not make the shard look dead to the launcher.
        probe = await asyncio.to_thread(self._model.probe)
        if not math.isfinite(probe):
            raise ProbeError(f"health probe on {self._model.device_name} returned {probe}")
        return decision_pb2.HealthResponse(probe=probe)

    async def _read(self, request: decision_pb2.ReadRequest) -> decision_pb2.ReadResponse:
        def work() -> decision_pb2.ReadResponse:
            batch = self._strategy.run(read_specs(request))
            logger.debug(
                "read batch",
                extra={
                    "fields": {
                        "reads": len(batch.outcomes),
                        "forward_passes": batch.forward_passes,
                        "packed_tokens": batch.packed_tokens,
                        "forward_ms": round(batch.forward_seconds * 1e3, 3),
                    }
                },
            )
            return read_response(batch)

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._model_thread, work)

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
