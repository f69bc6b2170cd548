"""Engines: how a batch of (prompt, labels) token reads becomes forward passes and label log-probabilities.
`make_engine` picks one by its --read-mode name (auto asks the architecture registry which one is exact)."""

from __future__ import annotations

import logging

from decision_server.architectures import choose_engine
from decision_server.engines.base import Engine, validate_read
from decision_server.engines.fork import ForkEngine
from decision_server.engines.naive import NaiveEngine
from decision_server.engines.tree import TreeEngine
from decision_server.engines.types import BatchOutcome, InvalidReadError, ReadOutcome, ReadSpec
from decision_server.model_base import LoadedModel
from decision_server.prefix_cache import PrefixCache

# Keyed by architectures.ENGINE_NAMES (the registry names engines without importing them; a test checks both agree).
ENGINES: dict[str, type[Engine]] = {"tree": TreeEngine, "fork": ForkEngine, "naive": NaiveEngine}

logger = logging.getLogger(__name__)


def make_engine(mode: str, model: LoadedModel, prefix_cache_mb: int = 0) -> Engine:
    """The engine for --read-mode `mode` (auto, tree, fork, naive); a prefix cache of `prefix_cache_mb` MiB when
    the tree engine can use one. Raises EngineRefusedError for tree on a model it would read wrongly."""
    if prefix_cache_mb < 0:
        raise ValueError(f"--prefix-cache-mb must be 0 or more, got {prefix_cache_mb}")
    name = choose_engine(mode, model.architecture, model.text_config)
    if name != "tree":
        if prefix_cache_mb:
            # The naive engine is the reference every other path is checked against: it never reuses anything;
            # the fork engine keeps states within a batch only.
            logger.warning(f"prefix cache ignored by the {name} engine", extra={"fields": {"mb": prefix_cache_mb}})
        return ENGINES[name](model)
    cache = None
    if prefix_cache_mb:
        reason = model.supports_prefix_cache()
        if reason is None:
            # The budget is the whole model's; each tensor-parallel rank holds its share of the heads.
            cache = PrefixCache(prefix_cache_mb * 1024 * 1024, heads_share=model.kv_heads_share)
        else:
            logger.warning("prefix cache disabled", extra={"fields": {"reason": reason, "mb": prefix_cache_mb}})
    return TreeEngine(model, prefix_cache=cache)


__all__ = [
    "ENGINES",
    "BatchOutcome",
    "Engine",
    "ForkEngine",
    "InvalidReadError",
    "NaiveEngine",
    "ReadOutcome",
    "ReadSpec",
    "TreeEngine",
    "make_engine",
    "validate_read",
]
