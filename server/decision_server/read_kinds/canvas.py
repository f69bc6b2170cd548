"""Canvas reads (block diffusion, DiffusionGemma): the proto's `canvas` read into a `CanvasSpec` (per row, its label
variants flattened, each one token), the engine's batch back into per-row results, and the warm-up read. Canvas
reads take no media on this shard."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from decision_server.architectures import CANVAS
from decision_server.engines import AnyEngine, CanvasBatchOutcome, CanvasRowSpec, CanvasSpec, InvalidReadError
from decision_server.media import MediaError
from decision_server.model_base import LoadedModel
from decision_server.pb import decision_pb2
from decision_server.read_kinds.codec import checked_kind, label_groups


def canvas_spec(read: decision_pb2.Read) -> CanvasSpec:
    """The canvas engine's input for one canvas read: per row, its label variants flattened (each one token: a
    canvas slot holds one token), with the group sizes kept for regrouping."""
    checked_kind(read, CANVAS)
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


def canvas_response(specs: list[CanvasSpec], batch: CanvasBatchOutcome) -> decision_pb2.ReadResponse:
    results = []
    for spec, outcome in zip(specs, batch.outcomes, strict=True):
        rows = [
            decision_pb2.CanvasRowResult(
                labels=label_groups(row.group_sizes, got.label_logprobs, f"read {spec.id} row {index}"),
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


class CanvasReads:
    name = CANVAS
    batch_message = "canvas batch"

    def from_pb(self, request: decision_pb2.ReadRequest) -> list[CanvasSpec]:
        for read in request.reads:
            if read.media:
                raise InvalidReadError(read.id, "canvas reads take no media on this shard")
        return [canvas_spec(read) for read in request.reads]

    async def with_media(
        self, specs: list[CanvasSpec], engine: AnyEngine, threads: Executor
    ) -> tuple[list[CanvasSpec], dict[int, MediaError]]:
        return specs, {}

    def to_pb(
        self, specs: list[CanvasSpec], batch: CanvasBatchOutcome, media_errors: dict[int, MediaError]
    ) -> decision_pb2.ReadResponse:
        return canvas_response(specs, batch)

    def log_fields(self, batch: CanvasBatchOutcome) -> dict[str, Any]:
        return {}

    def warm_up(self, model: LoadedModel, engine: AnyEngine) -> None:
        # A block-diffusion model has no plain causal forward: warm up the encoder and one canvas step.
        row = CanvasRowSpec(position=0, tokens=(0,), group_sizes=(1,))
        engine.run([CanvasSpec(id=0, prompt=(0, 0), canvas=(0,) * 16, rows=(row,))])
