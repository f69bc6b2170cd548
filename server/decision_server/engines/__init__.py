"""Engines: how a batch of (prompt, labels) token reads becomes forward passes and label log-probabilities.
`make_engine` picks one by its --read-mode name (auto asks the architecture registry which one is exact)."""

from __future__ import annotations

import logging

from decision_server.architectures import CANVAS_ENGINE, POOLED_ENGINE, choose_engine
from decision_server.batch_budget import BatchBudget, plan_batch_budget
from decision_server.engines.base import Engine, validate_read
from decision_server.engines.canvas import CanvasEngine, validate_canvas
from decision_server.engines.fork import ForkEngine
from decision_server.engines.naive import NaiveEngine
from decision_server.engines.pooled import PooledBatchOutcome, PooledEngine, PooledModel, PooledOutcome, PooledSpec
from decision_server.engines.tree import DEFAULT_MAX_LOGIT_ROWS, TreeEngine
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
from decision_server.prefix_cache import (
    AUTO_DEVICE_SHARE,
    AUTO_HOST_SHARE,
    CachePlan,
    PrefixCache,
    auto_plan,
    free_memory_bytes,
    kv_bytes_per_token,
)

# Keyed by architectures.ENGINE_NAMES (the registry names engines without importing them; a test checks both agree).
ENGINES: dict[str, type[Engine]] = {"tree": TreeEngine, "fork": ForkEngine, "naive": NaiveEngine}

logger = logging.getLogger(__name__)


def make_engine(
    mode: str, model: LoadedModel, prefix_cache_mb: int | str = 0, max_batch_tokens: int | None = None
) -> Engine | CanvasEngine | PooledEngine:
    """The engine for --read-mode `mode` (auto, tree, fork, naive), with the prefix cache `prefix_cache_mb` asks
    for (MiB, 0 for none, or "auto": `plan_prefix_cache`); its `cache_plan` says what it got. Its `batch_budget` is
    the packed tokens of one forward pass for --max-batch-prefill-tokens `max_batch_tokens` (None: auto,
    `batch_budget.plan_batch_budget`), after the cache's budget is set aside. Raises EngineRefusedError for tree on
    a model it would read wrongly. A block-diffusion model gets the canvas engine (its architecture decides; `mode`
    must be auto, or canvas)."""
    name = (
        mode
        if mode in (CANVAS_ENGINE, POOLED_ENGINE)
        else choose_engine(mode, model.architecture, model.text_config, model.path)
    )
    plan = plan_prefix_cache(name, model, prefix_cache_mb)
    budget = plan_batch_budget(model, plan, max_batch_tokens, logit_rows=DEFAULT_MAX_LOGIT_ROWS)
    engine: Engine | CanvasEngine | PooledEngine
    if name == POOLED_ENGINE:
        if not hasattr(model, "score_pooled"):
            raise ValueError(f"{model.path}: a joint-schema folder loaded without its head")
        pooled: PooledModel = model  # type: ignore[assignment]
        engine = PooledEngine(pooled, padded_tokens=budget.tokens)
    elif name == CANVAS_ENGINE:
        engine = CanvasEngine(model)
    elif name != "tree":
        engine = ENGINES[name](model)
    else:
        # The budget is the whole model's; each tensor-parallel rank holds its share of the heads.
        cache = PrefixCache(plan.capacity_bytes, heads_share=model.kv_heads_share) if plan.capacity_bytes else None
        engine = TreeEngine(model, max_packed_tokens=budget.tokens, prefix_cache=cache)
    engine.cache_plan = plan
    engine.batch_budget = budget
    return engine


def plan_prefix_cache(engine: str, model: LoadedModel, requested: int | str) -> CachePlan:
    """The prefix cache `engine` runs with for --prefix-cache-mb `requested`: a number of MiB as given (0: off), or
    "auto", sized from the model's key/value bytes per token and the memory free (`prefix_cache.auto_plan`).
    Every rank of a tensor-parallel group gets the same plan (the smallest), so their caches evict alike."""
    if requested != "auto" and (not isinstance(requested, int) or requested < 0):
        raise ValueError(f"--prefix-cache-mb must be auto or 0 or more, got {requested!r}")
    if requested == 0:
        return CachePlan.off("off: --prefix-cache-mb 0")
    if engine != "tree":
        # The naive engine is the reference every other path is checked against: it never reuses anything; the
        # fork engine keeps states within a batch only; canvas and pooled reads are one pass per request.
        reason = f"off: the {engine} engine keeps no prefixes"
    else:
        reason = model.supports_prefix_cache() or ""
    if reason:
        if requested != "auto":
            logger.warning("prefix cache disabled", extra={"fields": {"reason": reason, "mb": requested}})
        return CachePlan.off(reason if reason.startswith("off:") else f"off: {reason}")
    if requested != "auto":
        return CachePlan(int(requested) * 1024 * 1024, f"--prefix-cache-mb {requested}")
    per_token = kv_bytes_per_token(model.text_config, model.dtype)
    free = model.agree_min(free_memory_bytes(model.device))
    # On CPU the ranks of a group share the host's memory, so the whole model's cache takes the host share; on CUDA
    # each rank holds its part of every token on its own device.
    on_device = model.device.type == "cuda"
    share = AUTO_DEVICE_SHARE if on_device else AUTO_HOST_SHARE
    heads_share = model.kv_heads_share if on_device else (1, 1)
    return auto_plan(per_token, model.max_position_embeddings, free, share, heads_share)


__all__ = [
    "ENGINES",
    "BatchBudget",
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
    "plan_prefix_cache",
    "validate_canvas",
    "validate_read",
]
