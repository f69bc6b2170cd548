"""Next-token reads (causal LMs): the proto's `next_token` read into a `ReadSpec` (label groups flattened into
variants), the engine's batch back into regrouped results, media expanded by the folder's processor, and the
warm-up pass."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from decision_server.architectures import NEXT_TOKEN
from decision_server.engines import AnyEngine, BatchOutcome, InvalidReadError, ReadSpec
from decision_server.media import MediaError, MediaPrompt
from decision_server.model_base import LoadedModel, ScoreRequest
from decision_server.pb import decision_pb2
from decision_server.read_kinds.codec import (
    checked_kind,
    expand_media,
    fitting,
    label_groups,
    media_items,
    with_media_errors,
)


def read_spec(read: decision_pb2.Read, previous: tuple[int, ...] | None = None) -> ReadSpec:
    """The engine's input for one next-token read: every group's variants flattened, with the group sizes kept so
    the results can be regrouped (and messages can name a group and variant). `previous`: the prompt of the read
    before it in the request, whose first `shared_prefix` tokens begin this one's (the router sends a request's
    state once)."""
    checked_kind(read, NEXT_TOKEN)
    next_token = read.next_token
    for index, group in enumerate(next_token.labels):
        if not group.variants:
            raise InvalidReadError(read.id, f"label {index} has no variants")
    shared = next_token.shared_prefix
    if shared and (previous is None or shared > len(previous)):
        have = "no read before it" if previous is None else f"a previous prompt of {len(previous)} tokens"
        raise InvalidReadError(read.id, f"shared_prefix {shared} with {have}")
    prompt = previous[:shared] + tuple(next_token.token_ids) if shared and previous else tuple(next_token.token_ids)
    return ReadSpec(
        id=read.id,
        prompt=prompt,
        labels=tuple(tuple(variant.token_ids) for group in next_token.labels for variant in group.variants),
        cache_salt=read.cache_salt,
        group_sizes=tuple(len(group.variants) for group in next_token.labels),
        media=media_items(read),
    )


def read_specs(request: decision_pb2.ReadRequest) -> list[ReadSpec]:
    specs: list[ReadSpec] = []
    for read in request.reads:
        specs.append(read_spec(read, specs[-1].prompt if specs else None))
    return specs


def next_token_result(spec: ReadSpec, logprobs: list[float], greedy_token_id: int) -> decision_pb2.NextTokenResult:
    """The engine's flat per-variant log-probabilities regrouped as the read's label groups, variant order kept."""
    groups = label_groups(spec.sizes, logprobs, f"read {spec.id}")
    return decision_pb2.NextTokenResult(labels=groups, greedy_token_id=greedy_token_id)


def read_response(
    specs: list[ReadSpec], batch: BatchOutcome, media_errors: dict[int, MediaError] | None = None
) -> decision_pb2.ReadResponse:
    """Results in request order: the engine's outcomes for `specs`, and, at the positions in `media_errors`, the
    reads whose media could not be decoded (they never reached the engine)."""
    results = with_media_errors(
        iter(zip(specs, batch.outcomes, strict=True)),
        media_errors or {},
        len(specs),
        lambda pair: decision_pb2.ReadResult(
            id=pair[1].id,
            tokens_computed=pair[1].tokens_computed,
            tokens_cached=pair[1].tokens_cached,
            media_tokens=pair[1].media_tokens,
            next_token=next_token_result(pair[0], pair[1].label_logprobs, pair[1].greedy_token_id),
        ),
    )
    return decision_pb2.ReadResponse(
        results=results, forward_micros=round(batch.forward_seconds * 1e6), forward_passes=batch.forward_passes
    )


class NextTokenReads:
    name = NEXT_TOKEN
    batch_message = "read batch"

    def from_pb(self, request: decision_pb2.ReadRequest) -> list[ReadSpec]:
        return read_specs(request)

    async def with_media(
        self, specs: list[ReadSpec], engine: AnyEngine, threads: Executor
    ) -> tuple[list[ReadSpec], dict[int, MediaError]]:
        """Reads with media, processed by the folder's processor on the media threads."""
        if not any(spec.media for spec in specs):
            return specs, {}
        processor = engine.capabilities.media_processor
        if processor is None:
            first = next(spec for spec in specs if spec.media)
            raise InvalidReadError(first.id, "this model folder has no processor: it reads no media")
        limit = engine.capabilities.max_positions

        def prepare(spec: ReadSpec) -> MediaPrompt:
            # The longest label is read after the prompt (all but its last token are positions too).
            longest = max((len(label) for label in spec.labels), default=1)
            expanded = processor.prepare(spec.id, spec.prompt, spec.media)
            return fitting(expanded, spec.media, longest - 1, "its longest label", limit)

        return await expand_media(specs, prepare, threads)

    def to_pb(
        self, specs: list[ReadSpec], batch: BatchOutcome, media_errors: dict[int, MediaError]
    ) -> decision_pb2.ReadResponse:
        return read_response(specs, batch, media_errors)

    def log_fields(self, batch: BatchOutcome) -> dict[str, Any]:
        return {}

    def warm_up(self, model: LoadedModel, engine: AnyEngine) -> None:
        # One plain two-token forward through the model itself.
        model.score(ScoreRequest(token_ids=[0, 0], keep=[1], label_rows=[0], label_tokens=[0], greedy_rows=[0]))
