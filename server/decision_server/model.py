"""Loading a Hugging Face model folder behind the `LoadedModel` interface (model_base.py) as the architecture registry
says: the shard's own tensor-parallel decoder (decoder_model.py) or transformers' modeling (transformers_model.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from decision_server import fused
from decision_server.architectures import AUTO_CAUSAL_LM, DECODER, architecture_of, joint_schema_family, lookup
from decision_server.choices import CUDA_GRAPH_MODES
from decision_server.decoder_model import load_decoder_model
from decision_server.distributed import ParallelConfig
from decision_server.model_base import (
    DTYPES,
    KeyValueState,
    LoadedModel,
    ModelState,
    ScoredPass,
    ScoreRequest,
    dtype_name,
    pick_attn_implementation,
    resolve_dtype,
)
from decision_server.transformers_model import TransformersCacheState, TransformersModel, wrap_module

logger = logging.getLogger(__name__)

# The interface types are re-exported: callers load a model and use it through this one module.
__all__ = [
    "DTYPES",
    "KeyValueState",
    "LoadOptions",
    "LoadedModel",
    "ModelState",
    "ScoreRequest",
    "ScoredPass",
    "TransformersCacheState",
    "TransformersModel",
    "dtype_name",
    "load_config",
    "load_model",
    "pick_attn_implementation",
    "resolve_dtype",
    "wrap_module",
]


def load_config(path: Path) -> Any:
    """The folder's Hugging Face config (read before the weights: it decides the engine and the attention kernel)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


@dataclass(frozen=True)
class LoadOptions:
    """How `load_model` loads a folder: the serve flags that act on the weights (serve.py builds one from its
    `ServeConfig`); the defaults are a library caller's (`--dtype auto`, exact linears, eager layers, no record)."""

    dtype: str = "auto"
    threads: int | None = None
    # Whether the attention kernel must take a custom mask (tree and canvas engines: `pick_attn_implementation`).
    needs_custom_mask: bool = True
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    matmul: str = "exact"
    compile_mode: str = "off"
    # "auto": the compiled layers replay as CUDA graphs where the device has them (`step_graphs`); "off": never.
    cuda_graphs: str = "off"
    # The batch budget the shard was given (None: its device's own), which bounds the graphs' buckets.
    max_batch_prefill_tokens: int | None = None
    matmul_record: Path | None = None


def load_model(path: Path, options: LoadOptions | None = None) -> LoadedModel:
    """Loads the HF folder at `path` for inference as rank `options.parallel.rank` of `options.parallel.world_size`.

    The registry (architectures.py) says which code runs the architecture. Decoder architectures (Llama family,
    Qwen3) get the shard's own decoder when it accepts the config (each rank reads only its weight slices);
    everything else gets transformers' modeling, which cannot be split, so it is refused above world size 1.
    `matmul` ("auto", "exact", "fast", "split" or "widen", `layers.MATMUL_CHOICES`) is how the own decoder's linears
    multiply; auto times the modes of the model's dtype on this CPU and picks the fastest (`layers.resolve_matmul`).
    transformers' modeling always runs its own (exact) linears. The loaded model's `matmul` is the mode that runs,
    never "auto".
    `matmul_record`: the file where auto keeps each mode's fastest time across loads (the shard passes
    `paths.matmul_record()`; None, the library default, keeps nothing: a library caller's probes, a test's faked
    ones included, never reach the shard's record).
    `compile_mode` ("auto" or "off", `fused.COMPILE_MODES`): "auto" runs the own decoder's layers between attentions as
    compiled graphs (`layer_graph`) and fuses its half-precision elementwise chains (`fused`), where inductor builds on
    this machine.
    `cuda_graphs` ("auto" or "off", `choices.CUDA_GRAPH_MODES`): "auto" replays those compiled layers as CUDA graphs
    per token-count bucket on a CUDA device (`step_graphs`), up to `max_batch_prefill_tokens` where it is given.
    """
    from transformers.utils import logging as hf_logging

    from decision_server.decoder import DecoderShape, UnsupportedModelError
    from decision_server.distributed import pick_device as pick_rank_device
    from decision_server.layers import check_matmul, half_gemm_is_slow, mkl_kernels

    options = options or LoadOptions()
    dtype, threads, parallel = options.dtype, options.threads, options.parallel
    matmul, compile_mode, matmul_record = options.matmul, options.compile_mode, options.matmul_record
    needs_custom_mask = options.needs_custom_mask
    # The weight-loading bar draws with carriage returns, which garbles the JSON-lines log stream.
    hf_logging.disable_progress_bar()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    config = load_config(path)
    architecture = lookup(architecture_of(config))
    device = pick_rank_device(parallel)
    if threads is None and device.type == "cpu" and parallel.world_size > 1:
        # Ranks on one CPU share its cores: each takes its part rather than all of them, which would oversubscribe.
        torch.set_num_threads(max(1, torch.get_num_threads() // parallel.world_size))
    torch_dtype = resolve_dtype(dtype, device, config)
    slow_half = device.type == "cpu" and half_gemm_is_slow(torch_dtype)
    family = joint_schema_family(architecture.name, path)
    if family is not None:
        from decision_server.joint_schema import load_joint_schema_model

        pooled = load_joint_schema_model(path, torch_dtype, device, parallel)
        logger.info(
            "model loaded",
            extra={
                "fields": {
                    "path": str(path),
                    "architecture": pooled.architecture,
                    "joint_schema": family.name,
                    "implementation": pooled.implementation,
                    "dtype": dtype_name(torch_dtype),
                    "device": pooled.device_name,
                    "weight_bytes": pooled.weight_bytes(),
                    "rank": pooled.rank,
                    "world_size": pooled.world_size,
                    "threads": torch.get_num_threads(),
                }
            },
        )
        _warn_slow_half(slow_half, torch_dtype, "exact")
        return pooled
    check_matmul(matmul)
    fused.check_mode(compile_mode)
    if options.cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, got {options.cuda_graphs!r}")
    requested_matmul = matmul
    native = architecture.implementation == DECODER
    native_refusal: str | None = None
    loader = architecture.transformers_class
    if native:
        try:
            DecoderShape.from_config(config).check_world_size(parallel.world_size)
        except UnsupportedModelError as err:
            native, native_refusal = False, str(err)
            # A decoder architecture the decoder refuses (sliding windows, ...) is still a plain causal LM.
            loader = AUTO_CAUSAL_LM
    compiled = layers_compiled = False
    if native:
        # The decoder resolves auto itself, once its ranks can agree on one mode (`layers.resolve_matmul`).
        decoder = load_decoder_model(path, config, torch_dtype, device, parallel, matmul, matmul_record)
        loaded: LoadedModel = decoder
        matmul = loaded.matmul
        compiled = fused.enable(compile_mode, torch_dtype, device)
        if compile_mode == "auto":
            layers_compiled = decoder.network.compile_layers()
            decoder.network.capture_graphs(options.cuda_graphs, options.max_batch_prefill_tokens)
        decoder.choose_segment_kernel()
    elif parallel.world_size > 1:
        reason = native_refusal or f"{architecture.name} has no tensor-parallel implementation"
        raise UnsupportedModelError(
            f"{path}: cannot serve with --world-size {parallel.world_size}: {reason}. "
            "Serve it with --world-size 1 (--num-shard 1), where transformers' modeling runs it."
        )
    else:
        loaded = _load_transformers(path, loader, torch_dtype, device, needs_custom_mask)
        if requested_matmul not in ("auto", "exact"):
            logger.warning(
                "--matmul applies to the shard's own decoder only; transformers' modeling keeps its linears",
                extra={"fields": {"matmul": requested_matmul, "architecture": loaded.architecture}},
            )
        matmul = "exact"
    _warn_slow_half(slow_half, torch_dtype, matmul)
    logger.info(
        "model loaded",
        extra={
            "fields": {
                "path": str(path),
                "architecture": loaded.architecture,
                "implementation": loaded.implementation,
                "dtype": dtype_name(torch_dtype),
                "matmul": matmul,
                "mkl_kernels": mkl_kernels(),
                "compiled_chains": compiled,
                "compiled_layers": layers_compiled,
                "segment_attention": loaded.segment_attention,
                "cuda_graph_buckets": list(loaded.cuda_graph_buckets),
                "device": loaded.device_name,
                "rank": loaded.rank,
                "world_size": loaded.world_size,
                "weight_bytes": loaded.weight_bytes(),
                "attn_implementation": loaded.attn_implementation,
                "threads": torch.get_num_threads(),
                **({"fallback_reason": native_refusal} if native_refusal else {}),
            }
        },
    )
    return loaded


def _warn_slow_half(slow: bool, dtype: torch.dtype, matmul: str) -> None:
    """Warns where a half-precision model's linears run the dtype's slow path on this CPU (`slow`: no AVX-512 or AMX,
    `layers.half_gemm_is_slow`) and were not widened to float32 (`--matmul widen`, which auto picks there when the
    float32 copies fit in memory)."""
    if slow and matmul != "widen":
        logger.warning(
            "this --dtype has no fast GEMM on this CPU (it lacks AVX-512 or AMX) and its linears were not widened: "
            "every linear converts its weight and runs several times slower than float32 (--dtype auto, also "
            "exact) or than --matmul widen (float32 GEMMs of the widened weights, twice their memory)",
            extra={
                "fields": {
                    "dtype": dtype_name(dtype),
                    "matmul": matmul,
                    "cpu": torch.backends.cpu.get_cpu_capability(),
                }
            },
        )


class UnknownModelClassError(ValueError):
    """The registry names a transformers class this transformers version does not have."""


def _load_transformers(
    path: Path, class_name: str, torch_dtype: torch.dtype, device: torch.device, needs_custom_mask: bool
) -> TransformersModel:
    import transformers

    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise UnknownModelClassError(
            f"{path}: transformers {transformers.__version__} has no {class_name}; install a version that does"
        )
    attn = pick_attn_implementation(device, needs_custom_mask)
    try:
        module = model_class.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn)
    except ValueError as err:
        # Some architectures have no sdpa path; eager attention works everywhere, only slower.
        if attn != "sdpa" or "sdpa" not in str(err).lower():
            raise
        logger.warning("sdpa unsupported, falling back to eager attention", extra={"fields": {"reason": str(err)}})
        attn = "eager"
        module = model_class.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn)
    return wrap_module(module, path, device, torch_dtype)
