"""Engines: how a batch of (prompt, labels) token reads becomes forward passes and label log-probabilities.
`make_engine` picks one by its --read-mode name (auto asks the architecture registry which one is exact)."""

from __future__ import annotations

import logging

from decision_server.architectures import CANVAS_ENGINE, POOLED_ENGINE, choose_engine
from decision_server.engines.base import Engine, validate_read
from decision_server.engines.canvas import CanvasEngine, validate_canvas
from decision_server.engines.fork import ForkEngine
from decision_server.engines.naive import NaiveEngine
from decision_server.engines.pooled import PooledBatchOutcome, PooledEngine, PooledModel, PooledOutcome, PooledSpec
from decision_server.engines.tree import TreeEngine
from decision_server.engines.types import (
    BatchOutcome,
    CanvasBatchOutcome,
    CanvasOutcome,
    CanvasRowOutcome,
    CanvasRowSpec,
    CanvasSpec,
    InvalidReadError,
    ReadOutcome,
    ReadSpec,
)
from decision_server.model_base import LoadedModel
from decision_server.prefix_cache import PrefixCache

# Keyed by architectures.ENGINE_NAMES (the registry names engines without importing them; a test checks both agree).
ENGINES: dict[str, type[Engine]] = {"tree": TreeEngine, "fork": ForkEngine, "naive": NaiveEngine}

logger = logging.getLogger(__name__)


def make_engine(mode: str, model: LoadedModel, prefix_cache_mb: int = 0) -> Engine | CanvasEngine | PooledEngine:
    """The engine for --read-mode `mode` (auto, tree, fork, naive); a prefix cache of `prefix_cache_mb` MiB when
    the tree engine can use one. Raises EngineRefusedError for tree on a model it would read wrongly. A
    block-diffusion model gets the canvas engine (its architecture decides; `mode` must be auto, or canvas)."""
    if prefix_cache_mb < 0:
        raise ValueError(f"--prefix-cache-mb must be 0 or more, got {prefix_cache_mb}")
    name = (
        mode
        if mode in (CANVAS_ENGINE, POOLED_ENGINE)
        else choose_engine(mode, model.architecture, model.text_config, model.path)
    )
    if name == POOLED_ENGINE:
        if prefix_cache_mb:
            logger.warning("prefix cache ignored by the pooled engine", extra={"fields": {"mb": prefix_cache_mb}})
        if not hasattr(model, "score_pooled"):
            raise ValueError(f"{model.path}: a joint-schema folder loaded without its head")
        pooled: PooledModel = model  # type: ignore[assignment]
        return PooledEngine(pooled)
    if name == CANVAS_ENGINE:
        if prefix_cache_mb:
            logger.warning("prefix cache ignored by the canvas engine", extra={"fields": {"mb": prefix_cache_mb}})
        return CanvasEngine(model)
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
    "CanvasBatchOutcome",
    "CanvasEngine",
    "CanvasOutcome",
    "CanvasRowOutcome",
    "CanvasRowSpec",
    "CanvasSpec",
    "Engine",
    "ForkEngine",
    "InvalidReadError",
    "NaiveEngine",
    "PooledBatchOutcome",
    "PooledEngine",
    "PooledOutcome",
    "PooledSpec",
    "ReadOutcome",
    "ReadSpec",
    "TreeEngine",
    "make_engine",
    "validate_canvas",
    "validate_read",
]
