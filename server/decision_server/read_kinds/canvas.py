"""Canvas reads (block diffusion, DiffusionGemma): the proto's `canvas` read into a `CanvasSpec` (per row, its label
variants flattened, each one token), images expanded by the folder's processor, the engine's batch back into per-row
results, and the warm-up read."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from decision_server.architectures import CANVAS
from decision_server.engines import (
    AnyEngine,
    CanvasBatchOutcome,
    CanvasOutcome,
    CanvasRowSpec,
    CanvasSpec,
    InvalidReadError,
)
from decision_server.media import MediaError, MediaPrompt
from decision_server.model_base import LoadedModel
from decision_server.pb import decision_pb2
from decision_server.read_kinds.codec import (
    checked_kind,
    expand_media,
    fitting,
    label_groups,
    media_items,
    with_media_errors,
)


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
        media=media_items(read),
    )


def canvas_result(spec: CanvasSpec, outcome: CanvasOutcome) -> decision_pb2.ReadResult:
    rows = [
        decision_pb2.CanvasRowResult(
            labels=label_groups(row.group_sizes, got.label_logprobs, f"read {spec.id} row {index}"),
            greedy_token_id=got.greedy_token_id,
        )
        for index, (row, got) in enumerate(zip(spec.rows, outcome.rows, strict=True))
    ]
    return decision_pb2.ReadResult(
        id=outcome.id,
        tokens_computed=outcome.tokens_computed,
        tokens_cached=outcome.tokens_cached,
        media_tokens=outcome.media_tokens,
        canvas=decision_pb2.CanvasResult(rows=rows),
    )


def canvas_response(
    specs: list[CanvasSpec], batch: CanvasBatchOutcome, media_errors: dict[int, MediaError] | None = None
) -> decision_pb2.ReadResponse:
    """Results in request order: the engine's outcomes for `specs`, and, at the positions in `media_errors`, the
    reads whose images could not be decoded (they never reached the engine)."""
    results = with_media_errors(
        iter(zip(specs, batch.outcomes, strict=True)),
        media_errors or {},
        len(specs),
        lambda pair: canvas_result(*pair),
    )
    return decision_pb2.ReadResponse(
        results=results, forward_micros=round(batch.forward_seconds * 1e6), forward_passes=batch.forward_passes
    )


class CanvasReads:
    name = CANVAS
    batch_message = "canvas batch"

    def from_pb(self, request: decision_pb2.ReadRequest) -> list[CanvasSpec]:
        return [canvas_spec(read) for read in request.reads]

    async def with_media(
        self, specs: list[CanvasSpec], engine: AnyEngine, threads: Executor
    ) -> tuple[list[CanvasSpec], dict[int, MediaError]]:
        """Prompts with images expanded by the folder's processor on the media threads (the encoder reads them)."""
        if not any(spec.media for spec in specs):
            return specs, {}
        processor = engine.capabilities.media_processor
        if processor is None:
            first = next(spec for spec in specs if spec.media)
            raise InvalidReadError(first.id, "this model folder has no processor: it reads no media")
        limit = engine.capabilities.max_positions

        def prepare(spec: CanvasSpec) -> MediaPrompt:
            expanded = processor.prepare(spec.id, spec.prompt, spec.media)
            return fitting(expanded, spec.media, len(spec.canvas), "its canvas", limit)

        return await expand_media(specs, prepare, threads)

    def to_pb(
        self, specs: list[CanvasSpec], batch: CanvasBatchOutcome, media_errors: dict[int, MediaError]
    ) -> decision_pb2.ReadResponse:
        return canvas_response(specs, batch, media_errors)

    def log_fields(self, batch: CanvasBatchOutcome) -> dict[str, Any]:
        return {}

    def warm_up(self, model: LoadedModel, engine: AnyEngine) -> None:
        # A block-diffusion model has no plain causal forward: warm up the encoder and one canvas step.
        row = CanvasRowSpec(position=0, tokens=(0,), group_sizes=(1,))
        engine.run([CanvasSpec(id=0, prompt=(0, 0), canvas=(0,) * 16, rows=(row,))])
