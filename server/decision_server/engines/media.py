"""Reads with media. The reads of a batch with the same media (by content hash, in order) and the same expanded ids
up to the end of their media block share one prefill of that prefix: the vision tower and the media tokens' layers
run once, and each read continues a copy of the state with its own text (and each multi-token label with its
own). Only reads with equal media hashes and equal ids share anything, so two reads with the same token ids but
different images can never be mixed up. A read alone in its group with single-token labels (or whose media block
end is unknown) is one plain forward over its whole prompt, as before; the same image is decoded once
(multimodal.py keeps decoded images by content hash)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import TypeVar

import torch

from decision_server.engines.types import BatchOutcome, InvalidReadError, ReadOutcome, ReadSpec
from decision_server.media import MediaPrompt
from decision_server.model_base import MediaScoring, ScoredPass, ScoreRequest

T = TypeVar("T")

# Continuations of one media prefix run together along the batch dimension, this many per forward (each keeps
# its logit rows over the whole vocabulary, so the batch is bounded).
CONTINUATIONS_PER_PASS = 16


def run_media_reads(model: MediaScoring, reads: Sequence[ReadSpec], batch: BatchOutcome) -> list[ReadOutcome]:
    """Outcomes of reads with media, in the order given: the reads that share a media prefix from one prefill of
    it, the others each on its own (`run_media_read`)."""
    prompts = [_checked_prompt(model, read) for read in reads]
    groups: dict[Hashable, list[int]] = {}
    for index, (read, prompt) in enumerate(zip(reads, prompts, strict=True)):
        end = prompt.media_end
        if end is None or not 0 < end < len(prompt.input_ids):
            groups[("alone", index)] = [index]
            continue
        media = tuple((item.modality, item.sha256, item.max_seconds, item.max_frames) for item in read.media)
        groups.setdefault((media, prompt.input_ids[:end]), []).append(index)
    outcomes: dict[int, ReadOutcome] = {}
    for members in groups.values():
        group = [reads[index] for index in members]
        if len(group) == 1 and all(len(label) == 1 for label in group[0].labels):
            outcomes[members[0]] = run_media_read(model, group[0], batch)
            continue
        for index, outcome in zip(members, _run_shared(model, group, batch), strict=True):
            outcomes[index] = outcome
    return [outcomes[index] for index in range(len(reads))]


def _run_shared(model: MediaScoring, reads: Sequence[ReadSpec], batch: BatchOutcome) -> list[ReadOutcome]:
    """Reads whose prompts are equal, media included, up to their media block's end: one prefill of their longest
    common prefix (less one token, so every read has a row of its own to read), then every read's text (and, per
    multi-token label, its text and label) continuing that state, batched along the batch dimension."""
    prompts = [_checked_prompt(model, read) for read in reads]
    ids = [prompt.input_ids for prompt in prompts]
    shared = min(len(prompt) for prompt in ids) - 1
    for prompt in ids[1:]:
        shared = next((i for i in range(shared) if prompt[i] != ids[0][i]), shared)
    prefix = _timed(model, batch, shared, lambda: model.prefill_media(prompts[0], shared))
    # One continuation per read (its single-token labels at its last row) and one per multi-token label.
    sequences: list[tuple[int, int | None, list[int], list[int]]] = []
    for position, read in enumerate(reads):
        tail = list(ids[position][shared:])
        sequences.append((position, None, tail, [len(tail) - 1]))
        for index, label in enumerate(read.labels):
            if len(label) > 1:
                rows = list(range(len(tail) - 1, len(tail) + len(label) - 1))
                sequences.append((position, index, [*tail, *label[:-1]], rows))
    # Equal continuations (the same question twice) run once: their reads get the very same values.
    unique = list(dict.fromkeys((tuple(text), tuple(rows)) for _, _, text, rows in sequences))
    computed_once: list[torch.Tensor] = []
    for start in range(0, len(unique), CONTINUATIONS_PER_PASS):
        chunk = unique[start : start + CONTINUATIONS_PER_PASS]
        texts, kept = [list(text) for text, _ in chunk], [list(rows) for _, rows in chunk]
        tokens = len(chunk) * max(len(text) for text in texts)
        computed_once.extend(_timed(model, batch, tokens, partial(model.continue_media_rows, prefix, texts, kept)))
    by_key = dict(zip(unique, computed_once, strict=True))
    logprobs = [by_key[(tuple(text), tuple(rows))] for _, _, text, rows in sequences]
    values: list[dict[int, float]] = [{} for _ in reads]
    greedy = [0] * len(reads)
    computed = [0] * len(reads)
    computed[0] = shared
    for (position, label_index, text, _), rows_logprobs in zip(sequences, logprobs, strict=True):
        read = reads[position]
        computed[position] += len(text)
        if label_index is None:
            for index, label in enumerate(read.labels):
                if len(label) == 1:
                    values[position][index] = float(rows_logprobs[0, label[0]])
            greedy[position] = int(torch.argmax(rows_logprobs[0]))
        else:
            label = read.labels[label_index]
            values[position][label_index] = sum(float(rows_logprobs[step, token]) for step, token in enumerate(label))
    return [
        ReadOutcome(
            id=read.id,
            label_logprobs=[values[position][index] for index in range(len(read.labels))],
            greedy_token_id=greedy[position],
            tokens_computed=computed[position],
            media_tokens=prompts[position].media_tokens,
        )
        for position, read in enumerate(reads)
    ]


def _timed(model: MediaScoring, batch: BatchOutcome, tokens: int, work: Callable[[], T]) -> T:
    started = time.perf_counter()
    result = work()
    model.synchronize()
    batch.forward_seconds += time.perf_counter() - started
    batch.forward_passes += 1
    batch.packed_tokens += tokens
    return result


def _checked_prompt(model: MediaScoring, read: ReadSpec) -> MediaPrompt:
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
    return prompt


def run_media_read(model: MediaScoring, read: ReadSpec, batch: BatchOutcome) -> ReadOutcome:
    """One read on its own: one plain forward over its whole prompt (and one per multi-token label)."""
    prompt = _checked_prompt(model, read)
    length = len(prompt.input_ids)
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
