"""Tiny random-weight checkpoints of the registry's transformers architectures, built from their config classes.
They use a synthetic 512-token vocabulary (no tokenizer): the read paths see token ids only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB = 512

# Qwen3.5's rotary layout at a 32-wide head: a quarter rotates, in interleaved T/H/W sections (1+1+2 pairs).
_QWEN3_5_ROPE = {
    "rope_type": "default",
    "rope_theta": 1e6,
    "partial_rotary_factor": 0.25,
    "mrope_section": [1, 1, 2],
    "mrope_interleaved": True,
}
_QWEN3_5_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 64,
}


def _qwen3_5_text(moe: bool) -> dict[str, Any]:
    text: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        # Gated-delta-net (linear attention) layers between full-attention ones, as in the real checkpoints.
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": dict(_QWEN3_5_ROPE),
    }
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    else:
        text["intermediate_size"] = 128
    return text


def _qwen3_5() -> Any:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    return Qwen3_5ForConditionalGeneration(
        Qwen3_5Config(text_config=_qwen3_5_text(moe=False), vision_config=dict(_QWEN3_5_VISION))
    )


def _qwen3_5_moe() -> Any:
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    return Qwen3_5MoeForConditionalGeneration(
        Qwen3_5MoeConfig(text_config=_qwen3_5_text(moe=True), vision_config=dict(_QWEN3_5_VISION))
    )


def _lfm2_vl(layer_types: list[str]) -> Any:
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    text = {
        "model_type": "lfm2",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "block_auto_adjust_ff_dim": False,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "conv_L_cache": 3,
        "max_position_embeddings": 4096,
    }
    vision = {
        "model_type": "siglip2_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_patches": 16,
        "patch_size": 16,
    }
    config = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=VOCAB - 1, projector_hidden_size=64)
    return Lfm2VlForConditionalGeneration(config)


def _gemma4_text() -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        # Shorter than the test prompts, so sliding layers see only part of them.
        "sliding_window": 12,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 64,
        "max_position_embeddings": 4096,
        # Per-layer input embeddings and KV sharing (the last two layers reuse earlier keys), as in Gemma4 E2B.
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
        "num_kv_shared_layers": 2,
        "final_logit_softcapping": 30.0,
        "pad_token_id": 0,
    }


def _gemma4() -> Any:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    return Gemma4ForCausalLM(Gemma4TextConfig(**_gemma4_text()))


def _gemma4_multimodal() -> Any:
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    return Gemma4ForConditionalGeneration(
        Gemma4Config(text_config=_gemma4_text(), vision_config=vision, audio_config=None)
    )


# name -> (architecture, builder, hybrid)
TINY_MODELS: dict[str, tuple[str, Callable[[], Any], bool]] = {
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", _qwen3_5, True),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", _qwen3_5_moe, True),
    "lfm2_vl": (
        "Lfm2VlForConditionalGeneration",
        lambda: _lfm2_vl(["conv", "full_attention", "conv", "full_attention"]),
        True,
    ),
    # The same architecture with attention layers only: the config, not the name, makes a model hybrid.
    "lfm2_vl_attention": (
        "Lfm2VlForConditionalGeneration",
        lambda: _lfm2_vl(["full_attention", "full_attention"]),
        False,
    ),
    "gemma4": ("Gemma4ForCausalLM", _gemma4, False),
    "gemma4_multimodal": ("Gemma4ForConditionalGeneration", _gemma4_multimodal, False),
}


def build_tiny_model(name: str, out: Path, seed: int = 0) -> Path:
    """Writes checkpoint `name` (config.json + safetensors, float32) into `out` unless it is there already."""
    if (out / "config.json").is_file():
        return out
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    architecture, builder, _ = TINY_MODELS[name]
    torch.manual_seed(seed)
    module = builder().to(torch.float32)
    module.config.architectures = [architecture]
    module.save_pretrained(out)
    return out
