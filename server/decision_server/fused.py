"""The decoder's elementwise chains in half precision, fused by torch.compile (inductor's CPU code generation).

In bfloat16 a decoder layer's norms, rotary embedding and gated activation are a dozen eager passes over
(tokens, hidden) tensors, each widening to float32 and rounding back: about a quarter of a bfloat16 tree read on
an Intel AMX CPU, where the GEMMs are fast. inductor fuses each chain into one pass (1.14-1.21x per read there,
bench/results/2026-12-03-amx-fused/). The fused kernels keep intermediates in float32 instead of rounding each
op's result to bfloat16, so their labels move from eager bfloat16's by bfloat16's own rounding (about 2e-2 in
log-probability on random weights): a different bfloat16 rounding, not a less exact one (tests/test_fused.py
measures both against float32). float32 chains are never compiled here: they are few passes and stay bit-equal to
transformers' forward. (With `--compile auto` a pass of two rows or more runs through `layer_graph` instead, which
compiles the whole stretch between attentions in every dtype; these chains serve the passes it leaves eager.)

`call(fn, x, ...)` runs `fn`'s compiled twin where the chains are enabled (`enable`, once at load) and `x` is a
half-precision CPU tensor of at least two rows, and `fn` itself otherwise. Compiling needs a C++ compiler; where
it fails (none installed, an unsupported CPU) the shard logs why and runs every chain eagerly. inductor keeps its
kernels under the cache directory, so a restart reuses them instead of compiling again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from decision_server import choices
from decision_server.paths import INDUCTOR_CACHE_ENV, keep_compiled_kernels

logger = logging.getLogger(__name__)

COMPILE_MODES = choices.COMPILE_MODES
HALF_DTYPES = (torch.bfloat16, torch.float16)

_twins: dict[Callable[..., Any], Callable[..., Any]] = {}
_enabled = False


def enabled() -> bool:
    """Whether the half-precision chains run compiled."""
    return _enabled


def check_mode(mode: str) -> None:
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")


def enable(mode: str, dtype: torch.dtype, device: torch.device) -> bool:
    """Turns the compiled chains on for a half-precision CPU model unless `mode` is "off", after checking that
    inductor can build a kernel on this machine; logs the outcome either way. Returns whether they are on."""
    global _enabled
    check_mode(mode)
    _enabled = False
    if mode == "off" or dtype not in HALF_DTYPES or device.type != "cpu":
        return False
    keep_compiled_kernels()  # too late where torch already fixed its default; `cli` calls it before torch
    started = time.perf_counter()
    try:
        probe = torch.compile(_probe, dynamic=True)
        sample = torch.linspace(-2, 2, 64).to(dtype).view(2, 32)
        if not torch.equal(probe(sample), _probe(sample)):
            raise RuntimeError("a compiled probe kernel computed other numbers than eager torch")
    except Exception as err:  # any failure to build means eager, said once
        logger.warning(
            "compile auto: inductor cannot build kernels here; the elementwise chains run eagerly (slower in "
            "half precision; --compile off silences this)",
            extra={"fields": {"error": f"{type(err).__name__}: {err}"[:500]}},
        )
        return False
    _enabled = True
    logger.info(
        "compile auto: the half-precision elementwise chains run compiled (inductor); each compiles at warm-up",
        extra={
            "fields": {
                "probe_seconds": round(time.perf_counter() - started, 2),
                "cache": os.environ[INDUCTOR_CACHE_ENV],
            }
        },
    )
    return True


def disable() -> None:
    global _enabled
    _enabled = False


def call(
    fn: Callable[..., torch.Tensor],
    x: torch.Tensor,
    *args: Any,
    form: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """`fn(x, *args)`, through its compiled twin where that applies (the module docstring says when). `form`: the
    same computation written for the compiler, where `fn`'s eager tricks (`out=` into views of one buffer) do not
    compile; the twin compiles `form`, eager runs `fn`."""
    if not (_enabled and x.dtype in HALF_DTYPES and x.device.type == "cpu" and x.shape[0] > 1):
        # One row (or none) would specialise a graph of its own, for work too small to matter.
        return fn(x, *args)
    twin = _twins.get(fn)
    if twin is None:
        twin = _twins[fn] = torch.compile(form or fn, dynamic=True)
    try:
        return twin(x, *args)
    except Exception as err:  # a chain that fails to compile must not fail the read
        disable()
        logger.warning(
            "compiled elementwise chain failed; every chain runs eagerly from now on",
            extra={"fields": {"chain": fn.__name__, "error": f"{type(err).__name__}: {err}"[:500]}},
        )
        return fn(x, *args)


def _probe(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1
