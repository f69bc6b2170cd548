"""The DecisionShard gRPC service: protobuf reads in, the engine, protobuf results out.
Model work runs on one dedicated thread so the event loop keeps answering Health while a batch computes."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

import grpc

from decision_server import fused
from decision_server.architectures import read_kind
from decision_server.engines import (
    BatchOutcome,
    CanvasBatchOutcome,
    CanvasEngine,
    CanvasRowSpec,
    CanvasSpec,
    Engine,
    InvalidReadError,
    PooledBatchOutcome,
    PooledEngine,
    PooledSpec,
    ReadSpec,
)
from decision_server.errors import grpc_status_for, is_fatal
from decision_server.media import AUDIO, IMAGE, VIDEO, MediaError, MediaItem
from decision_server.model_base import LoadedModel, dtype_name
from decision_server.pb import decision_pb2, decision_pb2_grpc
from decision_server.telemetry import NoTracing, ReadTracer

logger = logging.getLogger(__name__)

Reply = TypeVar("Reply")


class ProbeError(RuntimeError):
    """The health probe ran but produced a non-finite value: the device or the weights are broken."""


MODALITIES = {decision_pb2.IMAGE: IMAGE, decision_pb2.AUDIO: AUDIO, decision_pb2.VIDEO: VIDEO}
# Media decoding and processing run on their own threads, so they never hold up the model thread's reads.
MEDIA_THREADS = 2
# Every read kind of the proto's oneof; a shard computes the one its engine reads and refuses the others as
# INVALID_ARGUMENT (a causal LM has no canvas, a block-diffusion model no plain next-token pass).
READ_KINDS = ("next_token", "pooled", "canvas")


def _checked_kind(read: decision_pb2.Read, computed: str) -> None:
    kind = read.WhichOneof("kind")
    if kind is None:
        raise InvalidReadError(read.id, f"no read kind set; this shard computes {computed} reads")
    if kind != computed:
        raise InvalidReadError(
            read.id, f"read kind {kind} is not computed by this shard (it computes {computed} reads)"
        )


def read_spec(read: decision_pb2.Read) -> ReadSpec:
    """The engine's input for one next-token read: every group's variants flattened, with the group sizes kept so
    the results can be regrouped (and messages can name a group and variant)."""
    _checked_kind(read, "next_token")
    next_token = read.next_token
    for index, group in enumerate(next_token.labels):
        if not group.variants:
            raise InvalidReadError(read.id, f"label {index} has no variants")
    return ReadSpec(
        id=read.id,
        prompt=tuple(next_token.token_ids),
        labels=tuple(tuple(variant.token_ids) for group in next_token.labels for variant in group.variants),
        cache_salt=read.cache_salt,
        group_sizes=tuple(len(group.variants) for group in next_token.labels),
        media=_media_items(read),
    )


def read_specs(request: decision_pb2.ReadRequest) -> list[ReadSpec]:
    return [read_spec(read) for read in request.reads]


def canvas_spec(read: decision_pb2.Read) -> CanvasSpec:
    """The canvas engine's input for one canvas read: per row, its label variants flattened (each one token: a
    canvas slot holds one token), with the group sizes kept for regrouping."""
    _checked_kind(read, "canvas")
    canvas = read.canvas
    rows = []
    for row_index, row in enumerate(canvas.rows):
        tokens: list[int] = []
        for group_index, group in enumerate(row.labels):
            if not group.variants:
                raise InvalidReadError(read.id, f"row {row_index} label {group_index} has no variants")
            for variant_index, variant in enumerate(group.variants):
                if len(variant.token_ids) != 1:
                    raise InvalidReadError(
                        read.id,
                        f"row {row_index} label {group_index} variant {variant_index} has "
                        f"{len(variant.token_ids)} tokens; a canvas slot reads exactly one",
                    )
                tokens.append(variant.token_ids[0])
        rows.append(
            CanvasRowSpec(
                position=row.position,
                tokens=tuple(tokens),
                group_sizes=tuple(len(group.variants) for group in row.labels),
            )
        )
    return CanvasSpec(
        id=read.id,
        prompt=tuple(canvas.prompt_ids),
        canvas=tuple(canvas.canvas_ids),
        rows=tuple(rows),
        cache_salt=read.cache_salt,
    )


def _media_items(read: decision_pb2.Read) -> tuple[MediaItem, ...]:
    items = []
    for index, item in enumerate(read.media):
        if item.modality not in MODALITIES:
            raise InvalidReadError(read.id, f"media item {index} has no modality")
        items.append(
            MediaItem(
                MODALITIES[item.modality],
                item.data,
                item.sha256,
                item.name or f"media.{index}",
                max_seconds=item.max_seconds,
                max_frames=item.max_frames,
            )
        )
    return tuple(items)


def pooled_spec(read: decision_pb2.Read) -> PooledSpec:
    """The pooled engine's input for one pooled read: its prompt, and per question its type and spans (counted
    from the prompt's end, checked by the engine against the prompt it runs)."""
    _checked_kind(read, "pooled")
    pooled = read.pooled
    questions = tuple(
        (
            question.type_id,
            (question.instructions.start, question.instructions.end),
            tuple((option.start, option.end) for option in question.options),
        )
        for question in pooled.questions
    )
    media = _media_items(read)
    if media and not pooled.media_start < pooled.media_end:
        raise InvalidReadError(read.id, "a pooled read with media needs the stretch of its placeholders")
    return PooledSpec(
        id=read.id,
        prompt=tuple(pooled.token_ids),
        questions=questions,
        media_range=(pooled.media_start, pooled.media_end),
        media=media,
    )


def pooled_response(
    specs: list[PooledSpec], batch: PooledBatchOutcome, media_errors: dict[int, MediaError] | None = None
) -> decision_pb2.ReadResponse:
    media_errors = media_errors or {}
    outcomes = iter(batch.outcomes)
    results = []
    for position in range(len(specs) + len(media_errors)):
        if position in media_errors:
            error = media_errors[position]
            results.append(decision_pb2.ReadResult(id=error.read_id, media_error=str(error)))
            continue
        outcome = next(outcomes)
        results.append(
            decision_pb2.ReadResult(
                id=outcome.id,
                tokens_computed=outcome.tokens_computed,
                media_tokens=outcome.media_tokens,
                pooled=decision_pb2.PooledResult(
                    questions=[decision_pb2.PooledQuestionResult(option_logits=row) for row in outcome.logits]
                ),
            )
        )
    return decision_pb2.ReadResponse(
        results=results,
        forward_micros=round(batch.forward_seconds * 1e6),
        head_micros=round(batch.head_seconds * 1e6),
        forward_passes=batch.forward_passes,
    )


def _groups(sizes: Sequence[int], logprobs: list[float], what: str) -> list[decision_pb2.LabelGroupLogprobs]:
    groups = []
    start = 0
    for size in sizes:
        groups.append(decision_pb2.LabelGroupLogprobs(variant_logprobs=logprobs[start : start + size]))
        start += size
    if start != len(logprobs):
        raise RuntimeError(f"{what}: {len(logprobs)} log-probabilities for {start} label variants")
    return groups


def canvas_response(specs: list[CanvasSpec], batch: CanvasBatchOutcome) -> decision_pb2.ReadResponse:
    results = []
    for spec, outcome in zip(specs, batch.outcomes, strict=True):
        rows = [
            decision_pb2.CanvasRowResult(
                labels=_groups(row.group_sizes, got.label_logprobs, f"read {spec.id} row {index}"),
                greedy_token_id=got.greedy_token_id,
            )
            for index, (row, got) in enumerate(zip(spec.rows, outcome.rows, strict=True))
        ]
        results.append(
            decision_pb2.ReadResult(
                id=outcome.id,
                tokens_computed=outcome.tokens_computed,
                tokens_cached=outcome.tokens_cached,
                canvas=decision_pb2.CanvasResult(rows=rows),
            )
        )
    return decision_pb2.ReadResponse(
        results=results, forward_micros=round(batch.forward_seconds * 1e6), forward_passes=batch.forward_passes
    )


def next_token_result(spec: ReadSpec, logprobs: list[float], greedy_token_id: int) -> decision_pb2.NextTokenResult:
    """The engine's flat per-variant log-probabilities regrouped as the read's label groups, variant order kept."""
    groups = _groups(spec.sizes, logprobs, f"read {spec.id}")
    return decision_pb2.NextTokenResult(labels=groups, greedy_token_id=greedy_token_id)


def read_response(
    specs: list[ReadSpec], batch: BatchOutcome, media_errors: dict[int, MediaError] | None = None
) -> decision_pb2.ReadResponse:
    """Results in request order: the engine's outcomes for `specs`, and, at the positions in `media_errors`, the
    reads whose media could not be decoded (they never reached the engine)."""
    media_errors = media_errors or {}
    outcomes = iter(zip(specs, batch.outcomes, strict=True))
    results = []
    for position in range(len(specs) + len(media_errors)):
        if position in media_errors:
            error = media_errors[position]
            results.append(decision_pb2.ReadResult(id=error.read_id, media_error=str(error)))
            continue
        spec, outcome = next(outcomes)
        results.append(
            decision_pb2.ReadResult(
                id=outcome.id,
                tokens_computed=outcome.tokens_computed,
                tokens_cached=outcome.tokens_cached,
                media_tokens=outcome.media_tokens,
                next_token=next_token_result(spec, outcome.label_logprobs, outcome.greedy_token_id),
            )
        )
    return decision_pb2.ReadResponse(
        results=results, forward_micros=round(batch.forward_seconds * 1e6), forward_passes=batch.forward_passes
    )


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
        engine: Engine | CanvasEngine | PooledEngine,
        on_fatal: Callable[[BaseException], None] | None = None,
        tracing: ReadTracer | None = None,
        model_thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self._model = model
        self._tracing: ReadTracer = tracing or NoTracing()
        self._engine = engine
        self._on_fatal = on_fatal
        # One thread: reads are serialised (each already uses every core) and never race on the model. `serve`
        # passes the thread that loaded the model and warmed it up (`model_thread` there says why).
        self._model_thread = model_thread or new_model_thread()
        self._media_threads = ThreadPoolExecutor(max_workers=MEDIA_THREADS, thread_name_prefix="media")

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
            batch_token_budget=self._engine.batch_budget.tokens,
            batch_budget_rule=self._engine.batch_budget.rule,
            read_kind=read_kind(self._engine.name),
        )

    async def _health(self) -> decision_pb2.HealthResponse:
        # Off the model thread: a long batch must not make the shard look dead to the launcher.
        probe = await asyncio.to_thread(self._model.probe)
        if not math.isfinite(probe):
            raise ProbeError(f"health probe on {self._model.device_name} returned {probe}")
        return decision_pb2.HealthResponse(probe=probe)

    async def _read(self, request: decision_pb2.ReadRequest) -> decision_pb2.ReadResponse:
        loop = asyncio.get_running_loop()
        engine = self._engine
        if isinstance(engine, CanvasEngine):
            return await loop.run_in_executor(self._model_thread, lambda: self._canvas_reads(engine, request))
        if isinstance(engine, PooledEngine):
            return await self._pooled_reads(engine, request)
        specs, media_errors = await self._with_media(read_specs(request))

        def work() -> decision_pb2.ReadResponse:
            batch = engine.run(specs)
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
            return read_response(specs, batch, media_errors)

        return await loop.run_in_executor(self._model_thread, work)

    def _canvas_reads(self, engine: CanvasEngine, request: decision_pb2.ReadRequest) -> decision_pb2.ReadResponse:
        for read in request.reads:
            if read.media:
                raise InvalidReadError(read.id, "canvas reads take no media on this shard")
        canvases = [canvas_spec(read) for read in request.reads]
        canvas_batch = engine.run(canvases)
        logger.debug(
            "canvas batch",
            extra={
                "fields": {
                    "reads": len(canvas_batch.outcomes),
                    "forward_passes": canvas_batch.forward_passes,
                    "packed_tokens": canvas_batch.packed_tokens,
                    "forward_ms": round(canvas_batch.forward_seconds * 1e3, 3),
                }
            },
        )
        return canvas_response(canvases, canvas_batch)

    async def _pooled_reads(self, engine: PooledEngine, request: decision_pb2.ReadRequest) -> decision_pb2.ReadResponse:
        """Pooled reads: media expanded on the media threads (a read whose media cannot be decoded is answered with
        its error, the others go on), then every read's backbone pass and head on the model thread."""
        loop = asyncio.get_running_loop()
        specs = [pooled_spec(read) for read in request.reads]
        prepare = getattr(self._model, "prepare_pooled_media", None)

        async def processed(spec: PooledSpec) -> PooledSpec | MediaError:
            if not spec.media:
                return spec
            if prepare is None:
                raise InvalidReadError(spec.id, "this model folder has no processor: it reads no media")
            try:
                prompt = await loop.run_in_executor(
                    self._media_threads, prepare, spec.id, spec.prompt, spec.media_range, spec.media
                )
            except MediaError as error:
                error.read_id = spec.id
                return error
            return replace(spec, media_prompt=prompt)

        done = await asyncio.gather(*(processed(spec) for spec in specs))
        errors = {position: item for position, item in enumerate(done) if isinstance(item, MediaError)}
        ready = [item for item in done if not isinstance(item, MediaError)]

        def work() -> decision_pb2.ReadResponse:
            batch = engine.run(ready)
            logger.debug(
                "pooled batch",
                extra={
                    "fields": {
                        "reads": len(batch.outcomes),
                        "forward_passes": batch.forward_passes,
                        "packed_tokens": batch.packed_tokens,
                        "forward_ms": round(batch.forward_seconds * 1e3, 3),
                        "head_ms": round(batch.head_seconds * 1e3, 3),
                    }
                },
            )
            return pooled_response(ready, batch, errors)

        return await loop.run_in_executor(self._model_thread, work)

    async def _with_media(self, specs: list[ReadSpec]) -> tuple[list[ReadSpec], dict[int, MediaError]]:
        """Reads with media, processed by the model's processor on the media threads (decoding an image must not
        hold up other requests' reads on the model thread). A read whose media cannot be decoded is left out of
        the batch and answered with its error at its position; the other reads go on."""
        if not any(spec.media for spec in specs):
            return specs, {}
        processor = getattr(self._model, "media", None)
        if processor is None:
            first = next(spec for spec in specs if spec.media)
            raise InvalidReadError(first.id, "this model folder has no processor: it reads no media")
        loop = asyncio.get_running_loop()

        async def processed(spec: ReadSpec) -> ReadSpec | MediaError:
            if not spec.media:
                return spec
            try:
                prompt = await loop.run_in_executor(
                    self._media_threads, processor.prepare, spec.id, spec.prompt, spec.media
                )
            except MediaError as error:
                error.read_id = spec.id
                return error
            return replace(spec, media_prompt=prompt)

        done = await asyncio.gather(*(processed(spec) for spec in specs))
        errors = {position: item for position, item in enumerate(done) if isinstance(item, MediaError)}
        return [item for item in done if not isinstance(item, MediaError)], errors

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
