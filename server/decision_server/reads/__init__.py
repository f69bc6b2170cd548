"""Read strategies: batches of (prompt, labels) token reads in, label log-probabilities out.
`make_read_strategy` is the registry the CLI and tests use to pick one by its --read-mode name."""

from __future__ import annotations

import logging

from decision_server.model import LoadedModel
from decision_server.prefix_cache import PrefixCache
from decision_server.reads.base import ReadStrategy, validate_read
from decision_server.reads.naive import NaiveReads
from decision_server.reads.tree import TreeReads
from decision_server.reads.types import BatchOutcome, InvalidReadError, ReadOutcome, ReadSpec

READ_MODES: dict[str, type[ReadStrategy]] = {"tree": TreeReads, "naive": NaiveReads}


logger = logging.getLogger(__name__)


def make_read_strategy(mode: str, model: LoadedModel, prefix_cache_mb: int = 0) -> ReadStrategy:
    """The strategy for --read-mode `mode`; a prefix cache of `prefix_cache_mb` MiB when tree reads can use one."""
    if mode not in READ_MODES:
        raise ValueError(f"unknown read mode {mode!r}; choose {', '.join(READ_MODES)}")
    if prefix_cache_mb < 0:
        raise ValueError(f"--prefix-cache-mb must be 0 or more, got {prefix_cache_mb}")
    if mode == "naive":
        if prefix_cache_mb:
            # The naive mode is the reference every other path is checked against: it never reuses anything.
            logger.warning("prefix cache ignored in naive read mode", extra={"fields": {"mb": prefix_cache_mb}})
        return NaiveReads(model)
    cache = None
    if prefix_cache_mb:
        reason = model.supports_prefix_cache()
        if reason is None:
            # The budget is the whole model's; each tensor-parallel rank holds its share of the heads.
            cache = PrefixCache(prefix_cache_mb * 1024 * 1024, heads_share=model.kv_heads_share)
        else:
            logger.warning("prefix cache disabled", extra={"fields": {"reason": reason, "mb": prefix_cache_mb}})
    return TreeReads(model, prefix_cache=cache)


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
