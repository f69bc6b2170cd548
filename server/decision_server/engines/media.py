"""Reads with media: one plain forward per read over the processor's expanded prompt (and one per multi-token
label), like the naive engine. They never share tree nodes, model states or cached prefixes with other reads, so two
reads with the same token ids but different images can never be mixed up; the same image is decoded once
(multimodal.py keeps decoded images by content hash)."""

from __future__ import annotations

import time

from decision_server.engines.types import BatchOutcome, InvalidReadError, ReadOutcome, ReadSpec
from decision_server.media import MediaPrompt
from decision_server.model_base import MediaScoring, ScoredPass, ScoreRequest


def run_media_read(model: MediaScoring, read: ReadSpec, batch: BatchOutcome) -> ReadOutcome:
    prompt = read.media_prompt
    if prompt is None:
        raise InvalidReadError(read.id, "a read with media reached the engine unprocessed")
    length = len(prompt.input_ids)
    longest = max((len(label) for label in read.labels), default=1)
    if length + longest - 1 > model.max_position_embeddings:
        raise InvalidReadError(
            read.id,
            f"prompt of {length} tokens with its media plus a label of {longest} tokens exceeds "
            f"max_position_embeddings {model.max_position_embeddings}",
        )
    single = [index for index, label in enumerate(read.labels) if len(label) == 1]
    answer = _forward(
        model,
        prompt,
        [],
        ScoreRequest(
            token_ids=[],
            keep=[length - 1],
            label_rows=[0] * len(single),
            label_tokens=[read.labels[i][0] for i in single],
            greedy_rows=[0],
        ),
        batch,
    )
    values = dict(zip(single, answer.label_logprobs, strict=True))
    computed = length
    for index, label in enumerate(read.labels):
        if len(label) == 1:
            continue
        extra = list(label[:-1])
        rows = _forward(
            model,
            prompt,
            extra,
            ScoreRequest(
                token_ids=[],
                keep=list(range(length - 1, length + len(extra))),
                label_rows=list(range(len(label))),
                label_tokens=list(label),
                greedy_rows=[],
            ),
            batch,
        )
        values[index] = sum(rows.label_logprobs)
        computed += length
    return ReadOutcome(
        id=read.id,
        label_logprobs=[values[index] for index in range(len(read.labels))],
        greedy_token_id=answer.greedy_tokens[0],
        tokens_computed=computed,
        media_tokens=prompt.media_tokens,
    )


def _forward(
    model: MediaScoring, prompt: MediaPrompt, extra: list[int], request: ScoreRequest, batch: BatchOutcome
) -> ScoredPass:
    started = time.perf_counter()
    scored = model.score_media(prompt, extra, request)
    model.synchronize()
    batch.forward_seconds += time.perf_counter() - started
    batch.forward_passes += 1
    batch.packed_tokens += len(prompt.input_ids) + len(extra)
    return scored
