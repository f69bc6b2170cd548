"""What the read kinds' protobuf codecs share: the kind check, media items, label groups, and the media step (reads
with media expanded on the media threads, a read whose media cannot be decoded answered with its error)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from decision_server.engines import InvalidReadError
from decision_server.media import AUDIO, IMAGE, VIDEO, MediaError, MediaItem, MediaPrompt
from decision_server.pb import decision_pb2

MODALITIES = {decision_pb2.IMAGE: IMAGE, decision_pb2.AUDIO: AUDIO, decision_pb2.VIDEO: VIDEO}


class MediaSpec(Protocol):
    """A read spec that can carry media (next-token, pooled and canvas reads)."""

    @property
    def id(self) -> int: ...

    @property
    def media(self) -> tuple[MediaItem, ...]: ...


Spec = TypeVar("Spec", bound=MediaSpec)


def checked_kind(read: decision_pb2.Read, computed: str) -> None:
    kind = read.WhichOneof("kind")
    if kind is None:
        raise InvalidReadError(read.id, f"no read kind set; this shard computes {computed} reads")
    if kind != computed:
        raise InvalidReadError(
            read.id, f"read kind {kind} is not computed by this shard (it computes {computed} reads)"
        )


def media_items(read: decision_pb2.Read) -> tuple[MediaItem, ...]:
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


def label_groups(sizes: Sequence[int], logprobs: list[float], what: str) -> list[decision_pb2.LabelGroupLogprobs]:
    groups = []
    start = 0
    for size in sizes:
        groups.append(decision_pb2.LabelGroupLogprobs(variant_logprobs=logprobs[start : start + size]))
        start += size
    if start != len(logprobs):
        raise RuntimeError(f"{what}: {len(logprobs)} log-probabilities for {start} label variants")
    return groups


async def expand_media(
    specs: list[Spec], prepare: Callable[[Spec], MediaPrompt], threads: Executor
) -> tuple[list[Spec], dict[int, MediaError]]:
    """`specs` with every read's media expanded by `prepare` on `threads` (decoding an image must not hold up other
    requests' reads on the model thread). A read whose media cannot be decoded is left out and returned with its
    error at its position; the other reads go on."""
    loop = asyncio.get_running_loop()

    async def processed(spec: Spec) -> Spec | MediaError:
        if not spec.media:
            return spec
        try:
            prompt = await loop.run_in_executor(threads, prepare, spec)
        except MediaError as error:
            error.read_id = spec.id
            return error
        expanded: Spec = replace(spec, media_prompt=prompt)  # type: ignore[type-var]
        return expanded

    done = await asyncio.gather(*(processed(spec) for spec in specs))
    errors = {position: item for position, item in enumerate(done) if isinstance(item, MediaError)}
    return [item for item in done if not isinstance(item, MediaError)], errors


def fitting(prompt: MediaPrompt, items: Sequence[MediaItem], after: int, what: str, max_positions: int) -> MediaPrompt:
    """`prompt` when it and the `after` tokens read after it (`what`) fit the model's positions. Otherwise the media
    made it too long (the router checked the prompt before they expanded): a MediaError naming the media fields,
    which the read is answered with (a 400), never a broken contract."""
    length = len(prompt.input_ids)
    if max_positions and length + after > max_positions:
        fields = ", ".join(dict.fromkeys(item.name.split(".")[0] for item in items))
        raise MediaError(
            fields,
            f"with its media expanded ({prompt.media_tokens} tokens) the prompt has {length} tokens, and {what} "
            f"adds {after}: more than the model's {max_positions} positions",
        )
    return prompt


def with_media_errors(
    outcomes: Iterator[Any], media_errors: dict[int, MediaError], count: int, result: Callable[[Any], Any]
) -> list[decision_pb2.ReadResult]:
    """`count` results in request order: `result(outcome)` for each outcome, and at the positions in `media_errors`
    the reads whose media could not be decoded (they never reached the engine)."""
    results = []
    for position in range(count + len(media_errors)):
        if position in media_errors:
            error = media_errors[position]
            results.append(decision_pb2.ReadResult(id=error.read_id, media_error=str(error)))
            continue
        results.append(result(next(outcomes)))
    return results
