"""Random-weight Clef checkpoints: a tiny Qwen3.5 (Clef-Flash) or Qwen3-Omni thinker (Clef-Omni) backbone beside a
random joint-schema head of a small config. The head's read path needs real backbones to test against; no hub here."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from decision_server.atomic import build_folder_atomically
from decision_server.export import write_chat_template
from decision_server.joint_head import HEAD_CONFIG, HEAD_WEIGHTS, JointSchemaHead
from decision_server.progress import StepProgress

logger = logging.getLogger(__name__)

CLEF_FILES = (
    "config.json",
    "model.safetensors",
    # vLLM loads every *.safetensors of a folder without an index as backbone weights, the head's included.
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "processor_config.json",
    HEAD_CONFIG,
    HEAD_WEIGHTS,
)
CLEF_FIXTURE_NAMES: tuple[str, ...] = ("tiny-clef-flash", "tiny-clef-omni")
# Recorded in the completion marker and checked by `make fixtures` (CLEF_FIXTURE_REVISION there): bumped whenever the
# folders change, so a cached older build is rebuilt. 2: Omni's text config says `mrope_interleaved` (see below).
CLEF_FIXTURE_REVISION = 2
HIDDEN_SIZE = 128
# A small head: two heads of 32, one routing layer, two field layers.
HEAD_SIZES = {"hidden_size": HIDDEN_SIZE, "width": 64, "routing_layers": 1, "layers": 2, "heads": 2, "feedforward": 128}

# Qwen3-Omni's media tokens beyond Qwen3's vocabulary, at their Qwen3-Omni ids (the 151671-151674 speech tokens fill
# the gap so the ids are the real ones).
OMNI_ADDED_TOKENS = (
    (151669, "<|audio_start|>"),
    (151670, "<|audio_end|>"),
    (151671, "<tts_pad>"),
    (151672, "<tts_text_bos>"),
    (151673, "<tts_text_eod>"),
    (151674, "<tts_text_bos_single>"),
    (151675, "<|audio_pad|>"),
)
OMNI_MEDIA_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
OMNI_VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 2,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": HIDDEN_SIZE,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [0],
}
OMNI_AUDIO: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 256,
    "d_model": 128,
    "output_dim": HIDDEN_SIZE,
    "downsample_hidden_size": 32,
    "n_window": 50,
    "n_window_infer": 800,
    "max_source_positions": 1500,
}


def make_clef_fixture(name: str, out: Path, seed: int = 0) -> bool:
    """Builds fixture `name` into `out`; returns False when `out` was already complete."""
    if name not in CLEF_FIXTURE_NAMES:
        raise ValueError(f"unknown Clef fixture {name!r}; known: {', '.join(CLEF_FIXTURE_NAMES)}")

    def build(tmp: Path) -> dict[str, Any]:
        return _build(name, seed, tmp)

    built = build_folder_atomically(out, CLEF_FILES, build, revision=CLEF_FIXTURE_REVISION)
    if not built:
        logger.info("fixture already complete", extra={"fields": {"path": str(out)}})
    return built


def _build(name: str, seed: int, tmp: Path) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    from decision_server.fixtures_hybrid import _qwen3_5_model, _write_processor

    hf_logging.disable_progress_bar()
    flash = name == "tiny-clef-flash"
    progress = StepProgress(logger, f"fixture {name}", total_steps=4)
    progress.step("writing the tokenizer, chat template and processor")
    if flash:
        from decision_server.fixtures_hybrid import _write_qwen3_5_tokenizer

        _write_qwen3_5_tokenizer(tmp)
    else:
        _write_omni_tokenizer(tmp)

    progress.step(f"initialising random backbone weights (seed {seed})")
    torch.manual_seed(seed)
    model: Any
    if flash:
        model = _qwen3_5_model(moe=False)
        model.config.architectures = ["Qwen3_5ForConditionalGeneration"]
    else:
        model = _omni_model()
        model.config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    model = model.to(torch.float32)
    model.config.dtype = torch.float32
    model.save_pretrained(tmp)
    _write_index(tmp)
    if flash:
        _write_processor(tmp, "qwen3_5")
    else:
        # vLLM's Omni vision tower reads these two keys transformers does not write.
        patch = OMNI_VISION["patch_size"]
        side = int(OMNI_VISION["num_position_embeddings"] ** 0.5)
        config = json.loads((tmp / "config.json").read_text())
        config["thinker_config"]["vision_config"].update({"image_size": patch * side, "apply_vit_abs_pos_embed": True})
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_omni_processor(tmp)

    progress.step("initialising the joint-schema head")
    write_random_head(tmp, HEAD_SIZES, seed)
    progress.finish(f"built {name}")
    return {"kind": "random-clef", "fixture": name, "seed": seed, "dtype": "float32", "head": HEAD_SIZES}


def write_random_head(folder: Path, sizes: dict[str, int], seed: int) -> None:
    """A head of `sizes` with every parameter random (norm gains and the three scalars too, so every term of §6 is
    exercised), saved as the checkpoint ships it."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed + 1)
    head = JointSchemaHead(**sizes)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name and name.endswith(".weight"):
                parameter.copy_(1.0 + 0.1 * noise)
            elif parameter.dim() == 0:
                parameter.copy_(0.5 * noise)
            else:
                parameter.add_(0.05 * noise)
    tensors = {name: tensor.contiguous() for name, tensor in head.state_dict().items()}
    save_file(tensors, str(folder / HEAD_WEIGHTS))
    (folder / HEAD_CONFIG).write_text(json.dumps(sizes, indent=2) + "\n")


def _write_index(folder: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    size = (folder / "model.safetensors").stat().st_size
    index = {"metadata": {"total_size": size}, "weight_map": dict.fromkeys(sorted(names), "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_omni_tokenizer(tmp: Path) -> None:
    """The Qwen3 tokenizer (a fair stand-in for Qwen3-Omni's) with Qwen3-Omni's audio tokens at their ids, and a
    Qwen3-style template whose media parts are the Omni placeholders."""
    import shutil

    from tokenizers import AddedToken, Tokenizer

    from decision_server.qwen3_tokenizer import TOKENIZER_FILES, qwen3_tokenizer_dir

    source = qwen3_tokenizer_dir()
    for file_name in TOKENIZER_FILES:
        if file_name != "tokenizer.json":
            shutil.copyfile(source / file_name, tmp / file_name)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    for expected, token in OMNI_ADDED_TOKENS:
        tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True)])
        if tokenizer.token_to_id(token) != expected:
            raise ValueError(f"Omni token {token!r} got id {tokenizer.token_to_id(token)}, not {expected}")
    tokenizer.save(str(tmp / "tokenizer.json"))
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    template = config.pop("chat_template", None)
    if not isinstance(template, str):
        raise ValueError(f"{source}: tokenizer_config.json carries no chat template")
    config["extra_special_tokens"] = OMNI_MEDIA_TOKENS
    added = config.setdefault("added_tokens_decoder", {})
    for token_id, token in OMNI_ADDED_TOKENS:
        added[str(token_id)] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    write_chat_template(tmp, template)


def _omni_model() -> Any:
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    text = {
        "vocab_size": 151936,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,  # vLLM's CPU attention rejects head sizes below 64
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "moe_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        # Qwen3-Omni's interleaved M-RoPE, its 24/20/20 sections scaled to head_dim 64. The real thinker config says
        # so twice, `interleaved` and `mrope_interleaved`: transformers always interleaves (it reads neither), vLLM
        # reads only `mrope_interleaved` and without it rotates T/H/W in contiguous sections, which leaves text
        # alone (all three position rows are equal there) but moved image reads 4.6e-3 off.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [12, 10, 10],
            "interleaved": True,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "pad_token_id": 151643,
        "eos_token_id": 151645,
    }
    thinker = {
        "text_config": text,
        "vision_config": dict(OMNI_VISION),
        "audio_config": dict(OMNI_AUDIO),
        "audio_token_id": 151675,
        "audio_start_token_id": 151669,
        "image_token_id": 151655,
        "video_token_id": 151656,
        # Read by its M-RoPE position rule; the real checkpoint's config carries them.
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "audio_end_token_id": 151670,
        "position_id_per_seconds": 13,
    }
    config = Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
    return Qwen3OmniMoeForConditionalGeneration(config)


def _write_omni_processor(folder: Path) -> None:
    """Qwen3-Omni's processor sized to the tiny towers: images of at most 256x256 pixels (64 tokens after the merge),
    Whisper features for audio, the Qwen3-VL video processor."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer, Qwen2VLImageProcessor, WhisperFeatureExtractor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = AutoTokenizer.from_pretrained(folder)
    patches = {
        "patch_size": OMNI_VISION["patch_size"],
        "merge_size": OMNI_VISION["spatial_merge_size"],
        "temporal_patch_size": OMNI_VISION["temporal_patch_size"],
    }
    processor = Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(**patches, size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256}),
        video_processor=Qwen3VLVideoProcessor(**patches),
        feature_extractor=WhisperFeatureExtractor(feature_size=OMNI_AUDIO["num_mel_bins"]),
        tokenizer=tokenizer,
    )
    with tempfile.TemporaryDirectory() as scratch:
        processor.save_pretrained(scratch)
        shutil.copy(Path(scratch) / "processor_config.json", folder / "processor_config.json")
