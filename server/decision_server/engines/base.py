"""The interface every engine implements, with the input checks they all share.
Checks run before any tensor work so a bad read fails the RPC with a clear message, never a device error."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from decision_server.batch_budget import BatchBudget
from decision_server.engines.media import run_media_read
from decision_server.engines.types import BatchOutcome, InvalidReadError, ReadSpec
from decision_server.model_base import LoadedModel
from decision_server.prefix_cache import CachePlan


def validate_read(read: ReadSpec, token_limit: int, max_positions: int) -> None:
    if not read.prompt:
        raise InvalidReadError(read.id, "prompt has no tokens")
    for index, label in enumerate(read.labels):
        if not label:
            raise InvalidReadError(read.id, f"{read.label_name(index)} has no tokens")
    for token in read.prompt:
        if token >= token_limit:
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


class Engine(ABC):
    """Executes a batch of next-token reads on one loaded model: which forward passes run, over which tokens, and
    what each shares with the others. Every engine computes the same log-probabilities; they differ in speed."""

    name: str
    # The proto read kind these engines compute.
    read_kind = "next_token"
    # The prefix cache it runs with (`make_engine` sets it); Info reports it.
    cache_plan = CachePlan.off("off")
    # The packed tokens one forward pass may hold (`make_engine` sets it); Info reports it to the router.
    batch_budget = BatchBudget(0, "unset")

    def __init__(self, model: LoadedModel) -> None:
        self.model = model

    def run(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        for read in reads:
            validate_read(read, self.model.token_limit, self.model.max_position_embeddings)
            if read.media and not hasattr(self.model, "score_media"):
                raise InvalidReadError(read.id, "this model reads no media")
        if not reads:
            return BatchOutcome(outcomes=[])
        text = [read for read in reads if not read.media]
        # All tensor work of a batch, cache bookkeeping included, happens without autograd tracking.
        with torch.inference_mode():
            batch = self._run_valid(text) if text else BatchOutcome(outcomes=[])
            if len(text) == len(reads):
                return batch
            # Reads with media run on their own (engines/media.py); results keep the batch's read order.
            text_outcomes = iter(batch.outcomes)
            batch.outcomes = [
                run_media_read(self.model, read, batch) if read.media else next(text_outcomes)  # type: ignore[arg-type]
                for read in reads
            ]
            return batch

    @abstractmethod
    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        """Runs reads that passed `validate_read`; results in request order."""
