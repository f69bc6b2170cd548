"""The model-level shape of a read, its outcome, and the error for reads the model cannot run.
These are plain token ids and floats: the gRPC layer converts to and from them, strategies never see protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReadSpec:
    """One read: the whole rendered prompt (answer position last) and the label token sequences to score."""

    id: int
    prompt: tuple[int, ...]
    labels: tuple[tuple[int, ...], ...]
    cache_salt: str = ""


@dataclass
class ReadOutcome:
    id: int
    # log P(label sequence | prompt) over the full vocabulary, in label order.
    label_logprobs: list[float]
    greedy_token_id: int
    # Prompt tokens this read made the model compute; a token shared within a forward pass counts once,
    # on the first read (in request order) whose prompt needed it.
    tokens_computed: int
    tokens_cached: int = 0


@dataclass
class BatchOutcome:
    outcomes: list[ReadOutcome]
    forward_seconds: float = 0.0
    forward_passes: int = 0
    # Tokens packed into the forward passes (prompt and label branches), for metrics and logs.
    packed_tokens: int = 0
    stats: dict[str, float] = field(default_factory=dict)


class InvalidReadError(ValueError):
    """A read the model cannot run as given; becomes INVALID_ARGUMENT naming the read and the problem."""

    def __init__(self, read_id: int, problem: str) -> None:
        super().__init__(f"read {read_id}: {problem}")
        self.read_id = read_id
        self.problem = problem
