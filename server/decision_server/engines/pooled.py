"""The pooled engine: joint-schema reads (Clef). Each read is a backbone forward over its whole prompt (media
expanded) and one pass of the model's head on that prompt's hidden states, which returns every question's option
logits. Text-only reads of a batch share padded forwards (longest first, at most `padded_tokens` per forward); a read
with media runs alone (its processor tensors and M-RoPE positions are its own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from decision_server.batch_budget import BatchBudget
from decision_server.engines.types import InvalidReadError, Started
from decision_server.joint_head import QUESTION_TYPES, PooledQuestion, PooledScores
from decision_server.media import MediaItem, MediaPrompt
from decision_server.model_base import Capabilities, PooledScoring
from decision_server.prefix_cache import CachePlan, PrefixCache

READ_KIND = "pooled"
# Padded tokens (reads x the longest) of one shared forward when none is given; `make_engine` gives the shard's batch
# budget (what the router packs a call to), so a batch it sends runs in one forward unless its lengths are far apart,
# and the pads cost at most as much as the batch itself.
PADDED_TOKENS = 8192


@dataclass(frozen=True)
class PooledSpec:
    """One pooled read as the router sent it: spans are counted from the end of the prompt (start < end <= 0)."""

    id: int
    prompt: tuple[int, ...]
    # (type id, instructions span, option spans) per question.
    questions: tuple[tuple[int, tuple[int, int], tuple[tuple[int, int], ...]], ...]
    media_range: tuple[int, int] = (0, 0)
    media: tuple[MediaItem, ...] = ()
    media_prompt: MediaPrompt | None = None


@dataclass
class PooledOutcome:
    id: int
    logits: list[list[float]]
    tokens_computed: int
    media_tokens: int = 0


@dataclass
class PooledBatchOutcome:
    outcomes: list[PooledOutcome]
    forward_seconds: float = 0.0
    head_seconds: float = 0.0
    forward_passes: int = 0
    packed_tokens: int = 0
    stats: dict[str, float] = field(default_factory=dict)


def padded_groups(lengths: Sequence[int], budget: int = PADDED_TOKENS) -> list[list[int]]:
    """Indices of reads grouped for shared padded forwards: longest first, a group grows while its reads times its
    longest stay within `budget` (a read longer than the budget is a group of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def absolute_questions(read: PooledSpec, length: int) -> list[PooledQuestion]:
    """The read's spans as positions of a prompt of `length` tokens, each checked to be a non-empty stretch of it."""
    if not read.questions:
        raise InvalidReadError(read.id, "a pooled read needs at least one question")
    questions = []
    for index, (type_id, span, options) in enumerate(read.questions):
        if not 0 <= type_id < QUESTION_TYPES:
            raise InvalidReadError(read.id, f"question {index}: type id {type_id} is not 0, 1 or 2")
        if not options:
            raise InvalidReadError(read.id, f"question {index} has no options")
        spans = []
        for what, (start, end) in [("instructions", span), *((f"option {k}", o) for k, o in enumerate(options))]:
            if not -length <= start < end <= 0:
                raise InvalidReadError(
                    read.id,
                    f"question {index} {what}: span [{start}, {end}) is not a non-empty stretch of the last "
                    f"{length} tokens (spans count from the end of the prompt)",
                )
            spans.append((length + start, length + end))
        questions.append(PooledQuestion(type_id=type_id, span=spans[0], options=tuple(spans[1:])))
    return questions


class PooledEngine:
    """Runs pooled reads; `name` is what Info reports."""

    name = READ_KIND
    read_kind = READ_KIND
    cache_plan = CachePlan.off("off")
    batch_budget = BatchBudget(0, "unset")
    prefix_cache: PrefixCache | None = None

    def __init__(self, model: PooledScoring, padded_tokens: int = PADDED_TOKENS) -> None:
        self.model = model
        self.padded_tokens = padded_tokens
        # The head is what this engine needs of a model; its media go through `model.prepare_pooled_media`.
        self.capabilities = Capabilities(prefix_cache_refusal="off: pooled reads keep no prefixes", pooled=model)

    def start(self, reads: Sequence[PooledSpec]) -> Started[PooledBatchOutcome]:
        """`run`: its passes end before it returns."""
        return Started.done(self.run(reads))

    def run(self, reads: Sequence[PooledSpec]) -> PooledBatchOutcome:
        # Every read is checked before any forward: one bad read fails the batch without wasted work.
        prepared = []
        for read in reads:
            if not read.prompt:
                raise InvalidReadError(read.id, "prompt has no tokens")
            if read.media and read.media_prompt is None:
                raise InvalidReadError(read.id, "a read with media reached the engine unprocessed")
            ids = read.media_prompt.input_ids if read.media_prompt is not None else read.prompt
            if len(ids) > self.model.max_position_embeddings:
                raise InvalidReadError(
                    read.id,
                    f"prompt of {len(ids)} tokens exceeds max_position_embeddings {self.model.max_position_embeddings}",
                )
            bad = next((t for t in read.prompt if t >= self.model.token_limit), None)
            if bad is not None:
                raise InvalidReadError(read.id, f"token id {bad} is outside the vocabulary ({self.model.token_limit})")
            prepared.append((read, absolute_questions(read, len(ids))))
        batch = PooledBatchOutcome(outcomes=[])
        scored: dict[int, PooledScores] = {}
        text = [n for n, (read, _) in enumerate(prepared) if read.media_prompt is None]
        for group in padded_groups([len(prepared[n][0].prompt) for n in text], self.padded_tokens):
            members = [text[g] for g in group]
            if len(members) == 1:
                read, questions = prepared[members[0]]
                scored[members[0]] = self.model.score_pooled(read.prompt, questions)
            else:
                reads_of = [(prepared[n][0].prompt, prepared[n][1]) for n in members]
                scored.update(zip(members, self.model.score_pooled_padded(reads_of), strict=True))
            batch.forward_passes += 1
        for n, (read, questions) in enumerate(prepared):
            if read.media_prompt is not None:
                scored[n] = self.model.score_pooled(read.prompt, questions, read.media_prompt)
                batch.forward_passes += 1
        for n, (read, _) in enumerate(prepared):
            scores = scored[n]
            batch.forward_seconds += scores.backbone_seconds + scores.head_seconds
            batch.head_seconds += scores.head_seconds
            batch.packed_tokens += scores.tokens
            batch.outcomes.append(
                PooledOutcome(
                    id=read.id, logits=scores.logits, tokens_computed=scores.tokens, media_tokens=scores.media_tokens
                )
            )
        return batch
