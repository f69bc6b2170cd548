"""Engines: how a batch of reads of one kind becomes forward passes (label log-probabilities, canvas rows, head
logits). `make_engine` builds one from `ENGINE_TABLE`, keyed by (read kind, mode); auto asks the architecture
registry which mode is exact."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from decision_server.architectures import (
    CANVAS,
    CANVAS_ENGINE,
    KIND_ENGINES,
    NEXT_TOKEN,
    POOLED,
    POOLED_ENGINE,
    EngineRefusedError,
    choose_engine,
    model_read_kind,
)
from decision_server.batch_budget import BatchBudget, plan_batch_budget
from decision_server.engines.base import Engine, NextTokenEngine, validate_read
from decision_server.engines.canvas import CanvasEngine, validate_canvas
from decision_server.engines.fork import ForkEngine
from decision_server.engines.naive import NaiveEngine
from decision_server.engines.pooled import PooledBatchOutcome, PooledEngine, PooledOutcome, PooledSpec
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
    Started,
)
from decision_server.model_base import Capabilities, LoadedModel, capabilities_of
from decision_server.prefix_cache import (
    AUTO_DEVICE_SHARE,
    AUTO_HOST_SHARE,
    CachePlan,
    PrefixCache,
    auto_plan,
    free_memory_bytes,
    kv_bytes_per_token,
)

# Any engine of any read kind, as the service and `serve` hold it.
AnyEngine = Engine[Any, Any]

# The next-token engines by --read-mode name: architectures.ENGINE_NAMES (the registry names engines without
# importing them; a test checks both agree).
ENGINES: dict[str, type[NextTokenEngine]] = {"tree": TreeEngine, "fork": ForkEngine, "naive": NaiveEngine}

logger = logging.getLogger(__name__)


def _tree(model: LoadedModel, capabilities: Capabilities, plan: CachePlan, budget: BatchBudget) -> AnyEngine:
    # The budget is the whole model's; each tensor-parallel rank holds its share of the heads.
    cache = PrefixCache(plan.capacity_bytes, heads_share=model.kv_heads_share) if plan.capacity_bytes else None
    return TreeEngine(model, max_packed_tokens=budget.tokens, prefix_cache=cache)


def _pooled(model: LoadedModel, capabilities: Capabilities, plan: CachePlan, budget: BatchBudget) -> AnyEngine:
    if capabilities.pooled is None:
        raise ValueError(f"{model.path}: a joint-schema folder loaded without its head")
    return PooledEngine(capabilities.pooled, padded_tokens=budget.tokens)


# (read kind the model computes, engine name) -> how that engine is built for a loaded model, its capabilities, its
# prefix cache plan and its batch budget. A pair not listed is a startup refusal.
EngineFactory = Callable[[LoadedModel, Capabilities, CachePlan, BatchBudget], AnyEngine]
ENGINE_TABLE: dict[tuple[str, str], EngineFactory] = {
    (NEXT_TOKEN, "tree"): _tree,
    (NEXT_TOKEN, "fork"): lambda model, *_: ForkEngine(model),
    (NEXT_TOKEN, "naive"): lambda model, *_: NaiveEngine(model),
    (CANVAS, CANVAS_ENGINE): lambda model, *_: CanvasEngine(model),
    (POOLED, POOLED_ENGINE): _pooled,
}


def make_engine(
    mode: str, model: LoadedModel, prefix_cache_mb: int | str = 0, max_batch_tokens: int | None = None
) -> AnyEngine:
    """The engine for --read-mode `mode` (auto, tree, fork, naive; or canvas / pooled, which `choose_engine` gives
    the models whose architecture decides), with the prefix cache `prefix_cache_mb` asks for (MiB, 0 for none, or
    "auto": `plan_prefix_cache`); its `cache_plan` says what it got. Its `batch_budget` is the packed tokens of one
    forward pass for --max-batch-prefill-tokens `max_batch_tokens` (None: auto, `batch_budget.plan_batch_budget`),
    after the cache's budget is set aside. The model's capabilities are resolved here, once, and the engine keeps
    them. Raises EngineRefusedError for tree on a model it would read wrongly, or a mode that does not read the
    model's kind."""
    kind = model_read_kind(model.architecture, model.path)
    name = (
        mode
        if mode == KIND_ENGINES.get(kind)
        else choose_engine(mode, model.architecture, model.text_config, model.path)
    )
    factory = ENGINE_TABLE.get((kind, name))
    if factory is None:
        raise EngineRefusedError(f"{model.architecture} computes {kind} reads; the {name} engine does not read them")
    capabilities = capabilities_of(model)
    plan = plan_prefix_cache(name, model, prefix_cache_mb, capabilities)
    budget = plan_batch_budget(model, plan, max_batch_tokens, logit_rows=DEFAULT_MAX_LOGIT_ROWS)
    engine = factory(model, capabilities, plan, budget)
    engine.capabilities = capabilities
    engine.cache_plan = plan
    engine.batch_budget = budget
    return engine


def plan_prefix_cache(engine: str, model: LoadedModel, requested: int | str, capabilities: Capabilities) -> CachePlan:
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
        reason = capabilities.prefix_cache_refusal or ""
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
    "ENGINE_TABLE",
    "AnyEngine",
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
    "NextTokenEngine",
    "PooledBatchOutcome",
    "PooledEngine",
    "PooledOutcome",
    "PooledSpec",
    "ReadOutcome",
    "ReadSpec",
    "Started",
    "TreeEngine",
    "make_engine",
    "plan_prefix_cache",
    "validate_canvas",
    "validate_read",
]
