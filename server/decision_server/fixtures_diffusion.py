"""A random-weight DiffusionGemma (block diffusion, MoE text layers), Gemma-style synthetic tokenizer and template.
Canvas reads need an encoder-decoder forward to test against; no hub is reachable here, so it is made offline."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from decision_server.atomic import build_folder_atomically
from decision_server.fixtures_hybrid import (
    GEMMA4_SPECIALS,
    HYBRID_FIXTURE_FILES,
    _add_config_keys,
    _ceil_to,
    _write_tokenizer_config,
    gemma4_tokenizer,
)
from decision_server.progress import StepProgress

logger = logging.getLogger(__name__)

ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
DIFFUSION_FIXTURE_NAMES: tuple[str, ...] = ("tiny-diffusiongemma",)

# Small enough for a sliding layer to drop the head of a 512-token state, so the reads test that path too.
SLIDING_WINDOW = 64
# The served canvas (block) length. Canvas reads use 16; joint canvases round up to 16s, up to this many tokens.
CANVAS_LENGTH = 64
MAX_POSITIONS = 8192
# Full-attention layers use wider heads than sliding ones, as the real checkpoints do.
GLOBAL_HEAD_DIM = 64

# DiffusionGemma's turns are Gemma4's (`<|turn>role\n...<turn|>\n`, the assistant is `model`), but the generation
# prompt stops at `<|turn>model\n`: the reader appends the thought block `<|channel>thought\n<channel|>` itself,
# outside the canvas (spec/PROMPTS.md §7). Thinking on puts `<|think|>` in the system turn, as Gemma4 does.
DIFFUSION_GEMMA_CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- set has_system = messages | length > 0 and messages[0].role in ['system', 'developer'] -%}
{%- set loop_messages = messages[1:] if has_system else messages -%}
{{- bos_token -}}
{%- if has_system or thinking -%}
    {{- '<|turn>system\n' -}}
    {%- if thinking -%}
        {{- '<|think|>' -}}
    {%- endif -%}
    {%- if has_system -%}
        {{- render_content(messages[0].content) | trim -}}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message.role == 'assistant' else message.role -%}
    {{- '<|turn>' + role + '\n' + (render_content(message.content) | trim) + '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
{%- endif -%}
"""


def make_diffusion_fixture(name: str, out: Path, seed: int = 0) -> bool:
    """Builds fixture `name` into `out`; returns False when `out` was already complete."""
    if name not in DIFFUSION_FIXTURE_NAMES:
        raise ValueError(f"unknown diffusion fixture {name!r}; known: {', '.join(DIFFUSION_FIXTURE_NAMES)}")

    def build(tmp: Path) -> dict[str, Any]:
        return _build(name, seed, tmp)

    built = build_folder_atomically(out, HYBRID_FIXTURE_FILES, build)
    if not built:
        logger.info("fixture already complete", extra={"fields": {"path": str(out)}})
    return built


def write_tokenizer(tmp: Path) -> int:
    """The Gemma-style synthetic tokenizer (▁ for spaces, byte fallback, Gemma4's specials incl. `<turn|>`, `<pad>`,
    `<|channel>`, `<channel|>`; A-Z, yes/no and 0-9 single tokens) and the DiffusionGemma-style template."""
    tokenizer = gemma4_tokenizer()
    tokenizer.save(str(tmp / "tokenizer.json"))
    _write_tokenizer_config(
        tmp,
        {
            "tokenizer_class": "TokenizersBackend",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "padding_side": "left",
            "model_max_length": MAX_POSITIONS,
        },
        DIFFUSION_GEMMA_CHAT_TEMPLATE,
    )
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def diffusion_gemma_model(vocab_size: int) -> Any:
    """DiffusionGemma's shape in miniature: interleaved sliding and full layers (the last full, with wider heads), MoE
    feed-forwards beside the dense one in every layer, final-logit softcapping, and a one-block vision tower."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig

    text = DiffusionGemmaTextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=SLIDING_WINDOW,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=GEMMA4_SPECIALS.index("<pad>"),
        bos_token_id=GEMMA4_SPECIALS.index("<bos>"),
        eos_token_id=[GEMMA4_SPECIALS.index(token) for token in ("<eos>", "<turn|>")],
        tie_word_embeddings=True,
        # Not a declared field: the per-layer view consumes it (the class keeps its final-logit softcap of 30).
        global_head_dim=GLOBAL_HEAD_DIM,  # type: ignore[call-arg]
    )
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS_LENGTH)
    return DiffusionGemmaForBlockDiffusion(config)


def _build(name: str, seed: int, tmp: Path) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    progress = StepProgress(logger, f"fixture {name}", total_steps=3)
    progress.step("building the Gemma-style tokenizer and chat template")
    token_count = write_tokenizer(tmp)
    progress.step(f"initialising random weights (seed {seed})")
    torch.manual_seed(seed)
    model = diffusion_gemma_model(_ceil_to(token_count, 128))
    model.config.architectures = [ARCHITECTURE]
    model = model.to(torch.float32)
    model.config.dtype = torch.float32
    progress.step("writing config.json and model.safetensors")
    model.save_pretrained(tmp)
    # transformers consumes `global_head_dim` when it builds the per-layer view and does not save it back.
    _add_config_keys(tmp, {"global_head_dim": GLOBAL_HEAD_DIM}, "text_config")
    progress.finish(f"built {name}")
    return {"kind": "random-diffusion_gemma", "fixture": name, "seed": seed, "dtype": "float32"}
