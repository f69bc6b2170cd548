"""Random-weight Qwen3 checkpoints paired with the real Qwen3 tokenizer and chat template.
No model hub is reachable, so tests of Qwen3 read paths run on these, built once and cached."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from decision_server.atomic import build_folder_atomically
from decision_server.export import write_chat_template
from decision_server.fixtures_clef import CLEF_FIXTURE_NAMES, make_clef_fixture
from decision_server.fixtures_diffusion import DIFFUSION_FIXTURE_NAMES, make_diffusion_fixture
from decision_server.fixtures_hybrid import HYBRID_FIXTURE_NAMES, make_hybrid_fixture
from decision_server.progress import StepProgress
from decision_server.qwen3_tokenizer import TOKENIZER_FILES, qwen3_tokenizer_dir

logger = logging.getLogger(__name__)

FIXTURE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

_COMMON: dict[str, Any] = {
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "use_sliding_window": False,
}

# name -> (config overrides, dtype the weights are saved in)
FIXTURES: dict[str, tuple[dict[str, Any], str]] = {
    # Small enough to build in a second and run every read path in tests.
    "tiny-qwen3": (
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
        },
        "float32",
    ),
    # Qwen3-0.6B's real shapes, for timings that mean something.
    "qwen3-0.6b": (
        {
            "num_hidden_layers": 28,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "max_position_embeddings": 40960,
        },
        "bfloat16",
    ),
}


# Every name `make_fixture` builds: the Qwen3 shapes above, then the hybrid and multimodal families, then diffusion.
FIXTURE_NAMES: tuple[str, ...] = (*FIXTURES, *HYBRID_FIXTURE_NAMES, *DIFFUSION_FIXTURE_NAMES, *CLEF_FIXTURE_NAMES)


def fixture_config(name: str) -> dict[str, Any]:
    """The Qwen3Config keyword arguments of fixture `name`."""
    if name not in FIXTURES:
        raise ValueError(f"unknown fixture {name!r}; known: {', '.join(sorted(FIXTURES))}")
    overrides, _ = FIXTURES[name]
    return {**_COMMON, **overrides}


def make_fixture(name: str, out: Path, seed: int = 0) -> bool:
    """Builds fixture `name` into `out`; returns False when `out` was already complete."""
    if name in HYBRID_FIXTURE_NAMES:
        return make_hybrid_fixture(name, out, seed=seed)
    if name in DIFFUSION_FIXTURE_NAMES:
        return make_diffusion_fixture(name, out, seed=seed)
    if name in CLEF_FIXTURE_NAMES:
        return make_clef_fixture(name, out, seed=seed)
    config_kwargs = fixture_config(name)
    _, dtype_name = FIXTURES[name]

    def build(tmp: Path) -> dict[str, Any]:
        return _build(name, config_kwargs, dtype_name, seed, tmp)

    built = build_folder_atomically(out, FIXTURE_FILES, build)
    if not built:
        logger.info("fixture already complete", extra={"fields": {"path": str(out)}})
    return built


def _build(name: str, config_kwargs: dict[str, Any], dtype_name: str, seed: int, tmp: Path) -> dict[str, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    progress = StepProgress(logger, f"fixture {name}", total_steps=4)
    progress.step("copying the Qwen3 tokenizer and chat template")
    source = qwen3_tokenizer_dir()
    for file_name in TOKENIZER_FILES:
        shutil.copyfile(source / file_name, tmp / file_name)
    template = json.loads((source / "tokenizer_config.json").read_text()).get("chat_template")
    if not isinstance(template, str) or not template:
        raise ValueError(f"{source / 'tokenizer_config.json'} carries no chat template")
    write_chat_template(tmp, template)

    progress.step(f"initialising random weights (seed {seed})")
    dtype = getattr(torch, dtype_name)
    config = Qwen3Config(**config_kwargs)
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    model: Any = Qwen3ForCausalLM(config)

    progress.step(f"casting to {dtype_name}")
    model = model.to(dtype)
    model.config.dtype = dtype

    progress.step("writing config.json and model.safetensors")
    model.save_pretrained(tmp)
    progress.finish(f"built {name}")
    return {"kind": "random-qwen3", "fixture": name, "seed": seed, "dtype": dtype_name}
