"""The `Engine` protocol every engine satisfies (tree, fork, naive, canvas, pooled), and the base of the next-token
engines with the input checks they share. Checks run before any tensor work so a bad read fails the RPC with a clear
message, never a device error."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, TypeVar

import torch

from decision_server.batch_budget import BatchBudget
from decision_server.engines.media import run_media_reads
from decision_server.engines.types import BatchOutcome, InvalidReadError, ReadSpec, Started
from decision_server.model_base import Capabilities, LoadedModel, capabilities_of
from decision_server.prefix_cache import CachePlan, PrefixCache

SpecT = TypeVar("SpecT", contravariant=True)
BatchT = TypeVar("BatchT", covariant=True)


class Engine(Protocol[SpecT, BatchT]):
    """How a batch of reads of one kind becomes forward passes on one loaded model. `make_engine` builds one from
    the table keyed by (read kind, mode); the read kind (`read_kinds/`) turns protobuf into its specs and its batch
    back into protobuf, so an engine never sees protobuf."""

    # What Info reports as `engine`, and the proto read kind the engine computes (`read_kinds.READ_KINDS`).
    name: str
    read_kind: str
    # The prefix cache plan and the packed tokens of one forward pass (`make_engine` sets both); Info reports them.
    cache_plan: CachePlan
    batch_budget: BatchBudget
    # The model's capabilities, resolved once when the engine was built for it.
    capabilities: Capabilities

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The cache of earlier batches' prefixes, where the engine keeps one (warm-up touches its memory)."""
        ...

    def run(self, reads: Sequence[SpecT]) -> BatchT:
        """Checks every read, then runs them; outcomes in request order."""
        ...

    def start(self, reads: Sequence[SpecT]) -> Started[BatchT]:
        """`run` in two steps: checks every read and starts the batch; `finish` on the result waits for it. Where
        the device queues work (the tree engine's passes on a GPU) the batch is still in flight when this returns;
        elsewhere it is done."""
        ...


def validate_read(read: ReadSpec, token_limit: int, max_positions: int) -> None:
    if not read.prompt:
        raise InvalidReadError(read.id, "prompt has no tokens")
    for index, label in enumerate(read.labels):
        if not label:
            raise InvalidReadError(read.id, f"{read.label_name(index)} has no tokens")
    if max(read.prompt) >= token_limit:  # one pass in C; a Python step per token cost ~10 ms per 270k tokens
        token = next(token for token in read.prompt if token >= token_limit)
        raise InvalidReadError(read.id, f"prompt token id {token} is out of range (vocabulary size {token_limit})")
    for index, label in enumerate(read.labels):
        for token in label:
            if token >= token_limit:
                raise InvalidReadError(
                    read.id,
                    f"{read.label_name(index)} token id {token} is out of range (vocabulary size {token_limit})",
                )
    if len(read.prompt) > max_positions:
        raise InvalidReadError(
            read.id, f"prompt of {len(read.prompt)} tokens exceeds max_position_embeddings {max_positions}"
        )
    # A label's last token is only scored, never fed, so the deepest position fed is prompt + label - 1 tokens.
    longest = max((len(label) for label in read.labels), default=1)
    if len(read.prompt) + longest - 1 > max_positions:
        raise InvalidReadError(
            read.id,
            f"prompt of {len(read.prompt)} tokens plus a label of {longest} tokens exceeds "
            f"max_position_embeddings {max_positions}",
        )


class NextTokenEngine(ABC):
    """Executes a batch of next-token reads on one loaded model: which forward passes run, over which tokens, and
    what each shares with the others. Every engine computes the same log-probabilities; they differ in speed."""

    name: str
    read_kind = "next_token"
    cache_plan = CachePlan.off("off")
    batch_budget = BatchBudget(0, "unset")
    prefix_cache: PrefixCache | None = None

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.capabilities = capabilities_of(model)

    def run(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        return self.start(reads).finish()

    def start(self, reads: Sequence[ReadSpec]) -> Started[BatchOutcome]:
        media_model = self.capabilities.media_scoring
        for read in reads:
            validate_read(read, self.model.token_limit, self.model.max_position_embeddings)
            if read.media and media_model is None:
                raise InvalidReadError(read.id, "this model reads no media")
        if not reads:
            return Started.done(BatchOutcome(outcomes=[]))
        text = [read for read in reads if not read.media]
        # All tensor work of a batch, cache bookkeeping included, happens without autograd tracking.
        with torch.inference_mode():
            if len(text) == len(reads):
                return self._start_valid(text)
            batch = self._run_valid(text) if text else BatchOutcome(outcomes=[])
            # Reads with media run apart from text reads, sharing only a prefill of equal media and ids among
            # themselves (engines/media.py); results keep the batch's read order.
            text_outcomes = iter(batch.outcomes)
            assert media_model is not None  # every read with media was checked above
            media_outcomes = iter(run_media_reads(media_model, [read for read in reads if read.media], batch))
            batch.outcomes = [next(media_outcomes) if read.media else next(text_outcomes) for read in reads]
            return Started.done(batch)

    def _start_valid(self, reads: Sequence[ReadSpec]) -> Started[BatchOutcome]:
        """Starts reads that passed `validate_read` (text only); engines whose passes can be in flight override it."""
        return Started.done(self._run_valid(reads))

    @abstractmethod
    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        """Runs reads that passed `validate_read`; results in request order."""
