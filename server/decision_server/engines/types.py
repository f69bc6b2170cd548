"""The model-level shape of a read, its outcome, and the error for reads the model cannot run.
These are plain token ids and floats: the gRPC layer converts to and from them, engines never see protobuf."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from decision_server.media import MediaItem, MediaPrompt


@dataclass(frozen=True)
class ReadSpec:
    """One read: the whole rendered prompt (answer position last) and the label token sequences to score.

    `labels` are the variants of every label group, flattened in order; `group_sizes` says how they split into
    groups (empty: each sequence is a group of its own). Engines score each sequence alone; only messages and the
    gRPC layer's regrouping use the groups.
    """

    id: int
    prompt: tuple[int, ...]
    labels: tuple[tuple[int, ...], ...]
    cache_salt: str = ""
    group_sizes: tuple[int, ...] = ()
    # The media the prompt's placeholders stand for; a read with media runs on its own (engines/media.py).
    media: tuple[MediaItem, ...] = ()
    # The processor's expansion of prompt and media, made before the batch runs (off the model thread).
    media_prompt: MediaPrompt | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        """The number of variants of each label group."""
        return self.group_sizes or (1,) * len(self.labels)

    def label_name(self, index: int) -> str:
        """How messages name flattened label `index`: "label 2", or "label 2 variant 1" in a group of several."""
        start = 0
        for group, size in enumerate(self.sizes):
            if index < start + size:
                return f"label {group}" if size == 1 else f"label {group} variant {index - start}"
            start += size
        raise IndexError(f"read {self.id} has {start} label sequences, not {index + 1}")


@dataclass
class ReadOutcome:
    id: int
    # log P(label sequence | prompt) over the full vocabulary, in the read's (flattened) label order.
    label_logprobs: list[float]
    greedy_token_id: int
    # Prompt tokens this read made the model compute; a token shared within a forward pass counts once,
    # on the first read (in request order) whose prompt needed it.
    tokens_computed: int
    tokens_cached: int = 0
    # Tokens the media placeholders grew into (part of tokens_computed).
    media_tokens: int = 0


@dataclass
class BatchOutcome:
    outcomes: list[ReadOutcome]
    forward_seconds: float = 0.0
    forward_passes: int = 0
    # Tokens packed into the forward passes (prompt and label branches), for metrics and logs.
    packed_tokens: int = 0
    stats: dict[str, float] = field(default_factory=dict)


T = TypeVar("T", covariant=True)
U = TypeVar("U")


@dataclass(frozen=True)
class Started(Generic[T]):
    """Work an engine has started (`Engine.start`): `finish` returns its outcome. `in_flight`: the device is still
    computing it (its passes were queued on a GPU), so the model thread may start the next batch, planning it while
    the device works, before it waits here; otherwise the work is done and `finish` only hands it over."""

    finish: Callable[[], T]
    in_flight: bool = False

    @classmethod
    def done(cls, outcome: U) -> Started[U]:
        return Started(lambda: outcome)


class InvalidReadError(ValueError):
    """A read the model cannot run as given; becomes INVALID_ARGUMENT naming the read and the problem."""

    def __init__(self, read_id: int, problem: str) -> None:
        super().__init__(f"read {read_id}: {problem}")
        self.read_id = read_id
        self.problem = problem


@dataclass(frozen=True)
class CanvasRowSpec:
    """One answer slot of a canvas: the canvas position read, and its label tokens (each variant one token),
    flattened over the label groups in order, `group_sizes` splitting them back."""

    position: int
    tokens: tuple[int, ...]
    group_sizes: tuple[int, ...]


@dataclass(frozen=True)
class CanvasSpec:
    """One canvas read: the encoder's prompt, the seeded canvas, and the rows to read after one denoising step."""

    id: int
    prompt: tuple[int, ...]
    canvas: tuple[int, ...]
    rows: tuple[CanvasRowSpec, ...]
    cache_salt: str = ""
    # The images the prompt's placeholders stand for, and the processor's expansion of prompt and images (made
    # before the batch runs, off the model thread).
    media: tuple[MediaItem, ...] = ()
    media_prompt: MediaPrompt | None = None

    @property
    def encoded(self) -> tuple[int, ...]:
        """The ids the encoder runs: the prompt with its media placeholders expanded, or the prompt itself."""
        return self.media_prompt.input_ids if self.media_prompt is not None else self.prompt


@dataclass
class CanvasRowOutcome:
    # log P(token at the row's position) over the full vocabulary, one per label variant, flattened in row order.
    label_logprobs: list[float]
    greedy_token_id: int


@dataclass
class CanvasOutcome:
    id: int
    rows: list[CanvasRowOutcome]
    # Prompt tokens the encoder ran for this read: a prompt shared within a batch counts once, on its first read.
    tokens_computed: int
    tokens_cached: int = 0
    # Tokens the media placeholders grew into (part of the encoded prompt).
    media_tokens: int = 0


@dataclass
class CanvasBatchOutcome:
    outcomes: list[CanvasOutcome]
    forward_seconds: float = 0.0
    # Encoder passes (one per distinct prompt) plus decoder passes (one per prompt and canvas width).
    forward_passes: int = 0
    packed_tokens: int = 0
