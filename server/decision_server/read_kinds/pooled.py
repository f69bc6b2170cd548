"""Pooled reads (joint-schema models, Clef): the proto's `pooled` read into a `PooledSpec` (spans counted from the
prompt's end), media expanded by the model's own processor, the head's option logits back per question, and the
warm-up read."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from decision_server.architectures import POOLED
from decision_server.engines import AnyEngine, InvalidReadError, PooledBatchOutcome, PooledSpec
from decision_server.media import MediaError
from decision_server.model_base import LoadedModel
from decision_server.pb import decision_pb2
from decision_server.read_kinds.codec import checked_kind, expand_media, media_items, with_media_errors


def pooled_spec(read: decision_pb2.Read) -> PooledSpec:
    """The pooled engine's input for one pooled read: its prompt, and per question its type and spans (counted
    from the prompt's end, checked by the engine against the prompt it runs)."""
    checked_kind(read, POOLED)
    pooled = read.pooled
    questions = tuple(
        (
            question.type_id,
            (question.instructions.start, question.instructions.end),
            tuple((option.start, option.end) for option in question.options),
        )
        for question in pooled.questions
    )
    media = media_items(read)
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
    results = with_media_errors(
        iter(batch.outcomes),
        media_errors or {},
        len(specs),
        lambda outcome: decision_pb2.ReadResult(
            id=outcome.id,
            tokens_computed=outcome.tokens_computed,
            media_tokens=outcome.media_tokens,
            pooled=decision_pb2.PooledResult(
                questions=[decision_pb2.PooledQuestionResult(option_logits=row) for row in outcome.logits]
            ),
        ),
    )
    return decision_pb2.ReadResponse(
        results=results,
        forward_micros=round(batch.forward_seconds * 1e6),
        head_micros=round(batch.head_seconds * 1e6),
        forward_passes=batch.forward_passes,
    )


class PooledReads:
    name = POOLED
    batch_message = "pooled batch"

    def from_pb(self, request: decision_pb2.ReadRequest) -> list[PooledSpec]:
        return [pooled_spec(read) for read in request.reads]

    async def with_media(
        self, specs: list[PooledSpec], engine: AnyEngine, threads: Executor
    ) -> tuple[list[PooledSpec], dict[int, MediaError]]:
        """Media expanded by the model's processor on the media threads; a read whose media cannot be decoded is
        answered with its error, the others go on."""
        model = engine.capabilities.pooled
        if model is None:
            first = next((spec for spec in specs if spec.media), None)
            if first is not None:
                raise InvalidReadError(first.id, "this model folder has no processor: it reads no media")
            return specs, {}
        return await expand_media(
            specs, lambda spec: model.prepare_pooled_media(spec.id, spec.prompt, spec.media_range, spec.media), threads
        )

    def to_pb(
        self, specs: list[PooledSpec], batch: PooledBatchOutcome, media_errors: dict[int, MediaError]
    ) -> decision_pb2.ReadResponse:
        return pooled_response(specs, batch, media_errors)

    def log_fields(self, batch: PooledBatchOutcome) -> dict[str, Any]:
        return {"head_ms": round(batch.head_seconds * 1e3, 3)}

    def warm_up(self, model: LoadedModel, engine: AnyEngine) -> None:
        # The backbone and the head once, on a four-token prompt with one two-option question.
        engine.run([PooledSpec(id=0, prompt=(0, 0, 0, 0), questions=((0, (-4, -3), ((-3, -2), (-2, -1))),))])
