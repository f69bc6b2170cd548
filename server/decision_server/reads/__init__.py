"""Read strategies: batches of (prompt, labels) token reads in, label log-probabilities out.
`make_read_strategy` is the registry the CLI and tests use to pick one by its --read-mode name."""

from __future__ import annotations

from decision_server.model import LoadedModel
from decision_server.reads.base import ReadStrategy, validate_read
from decision_server.reads.naive import NaiveReads
from decision_server.reads.tree import TreeReads
from decision_server.reads.types import BatchOutcome, InvalidReadError, ReadOutcome, ReadSpec

READ_MODES: dict[str, type[ReadStrategy]] = {"tree": TreeReads, "naive": NaiveReads}


def make_read_strategy(mode: str, model: LoadedModel) -> ReadStrategy:
    if mode not in READ_MODES:
        raise ValueError(f"unknown read mode {mode!r}; choose {', '.join(READ_MODES)}")
    return READ_MODES[mode](model)


__all__ = [
    "READ_MODES",
    "BatchOutcome",
    "InvalidReadError",
    "NaiveReads",
    "ReadOutcome",
    "ReadSpec",
    "ReadStrategy",
    "TreeReads",
    "make_read_strategy",
    "validate_read",
]
