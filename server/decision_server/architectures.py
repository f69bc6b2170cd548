"""The shard's registry keyed by architecture: which model code loads a checkpoint, and which engines read it exactly.
Adding an architecture is one `Architecture(...)` line; whether it is hybrid is read from its config's layer kinds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decision_server import choices

DECODER = "decoder"
TRANSFORMERS = "transformers"
# transformers' generic loader, for architectures the registry does not list.
AUTO_CAUSAL_LM = "AutoModelForCausalLM"

ENGINE_NAMES = choices.ENGINE_NAMES
# `--read-mode` values: auto picks tree for all-attention models and fork for hybrids.
READ_MODES = choices.READ_MODES
# Reads of block-diffusion models: an encoder pass per prompt, then one bidirectional step per canvas. Not a
# `--read-mode`: the architecture decides it (auto), and the next-token engines cannot read these models.
CANVAS_ENGINE = "canvas"
# Reads of joint-schema models (Clef): one backbone pass per prompt, scored by the checkpoint's head. Like canvas,
# chosen by the folder (its architecture plus `joint_head_config.json`), never by `--read-mode`.
POOLED_ENGINE = "pooled"
NEXT_TOKEN = "next_token"
CANVAS = "canvas"
POOLED = "pooled"
# The one engine of each read kind that --read-mode does not choose (the architecture decides).
KIND_ENGINES = {CANVAS: CANVAS_ENGINE, POOLED: POOLED_ENGINE}
# Why `--read-mode tree|fork|naive` cannot read those kinds, as the startup refusal says it.
KIND_REFUSALS = {
    POOLED: "its joint-schema head scores every question in one pooled read (one backbone pass per prompt)",
    CANVAS: "it is a block-diffusion model, read by canvas reads (one encoder pass, one bidirectional denoising step)",
}
# The file beside config.json that makes a Qwen3.5 / Qwen3-Omni folder a joint-schema (Clef) checkpoint.
JOINT_HEAD_MARKER = "joint_head_config.json"

# Layer kinds a tree mask computes exactly: attention that applies any mask it is given (sliding layers get a
# windowed one). Other attention kinds (chunked, compressed, ...) would need masks the tree engine does not build.
TREE_LAYER_KINDS = frozenset({"full_attention", "sliding_attention"})
# Layer kinds that run a recurrence or a convolution in sequence order and never look at an attention mask.
MASK_FREE_LAYER_KINDS = frozenset({"linear_attention", "conv", "mamba", "mamba2", "recurrent", "rwkv", "ssm"})
# Whole families with no attention at all; their configs list no layer kinds.
RECURRENT_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"})


class EngineRefusedError(ValueError):
    """The requested engine would compute wrong log-probabilities for this model; the message says why."""


def reset_rope_deltas(module: Any) -> None:
    """Qwen3.5 keeps the M-RoPE offset of its last multimodal prompt on the module and adds it to later calls that
    continue a cache (trap 2 in STRATEGIES.md: 0.073 off). Reads pass explicit positions too; this makes sure no
    offset of an earlier call survives into the next."""
    inner = getattr(module, "model", None)
    if inner is not None and getattr(inner, "rope_deltas", None) is not None:
        inner.rope_deltas = None


@dataclass(frozen=True)
class Architecture:
    """How the shard serves one `architectures[0]` of config.json.

    `implementation` "decoder" runs the shard's own tensor-parallel decoder when it accepts the config (falling back
    to transformers at world size 1 when it does not, e.g. for sliding windows); "transformers" loads
    `transformers.<model_class>` (the class named like the architecture unless given). Text-only reads pass
    input_ids and explicit position ids, which every listed class accepts without media arguments.
    """

    name: str
    implementation: str
    model_class: str | None = None
    # Called before every forward: resets state a module keeps between calls.
    prepare_forward: Callable[[Any], None] | None = None
    # The media its reads take, when the folder ships the model's processor for them.
    media: frozenset[str] = frozenset()
    # Images larger than this many pixels are shrunk (by area, bicubic) before the processor (Liquid d1's rule).
    image_area_cap: int | None = None
    # The forward takes the processor's `mm_token_type_ids` (which tokens are image / video placeholders).
    mm_token_type_ids: bool = False
    # The read kind the model computes: next-token reads (causal LMs) or canvas reads (block diffusion).
    reads: str = NEXT_TOKEN
    # What the media table (media_table.py) says beside a medium: how it is read, or why it is refused.
    media_notes: tuple[tuple[str, str], ...] = ()

    @property
    def transformers_class(self) -> str:
        return self.model_class or self.name


IMAGE, VIDEO, AUDIO = "image", "video", "audio"
IMAGES = frozenset({IMAGE})
# Qwen3.5 reads videos too (the seed's "T + I + V"; vLLM 0.33's next-token reads stop at images).
IMAGES_AND_VIDEOS = frozenset({IMAGE, VIDEO})
TWO_FPS = "2 fps"

ARCHITECTURES: dict[str, Architecture] = {
    entry.name: entry
    for entry in (
        Architecture("LlamaForCausalLM", DECODER),
        Architecture("Qwen3ForCausalLM", DECODER),
        Architecture(
            "Qwen3_5ForConditionalGeneration",
            TRANSFORMERS,
            prepare_forward=reset_rope_deltas,
            media=IMAGES_AND_VIDEOS,
            mm_token_type_ids=True,
            media_notes=((VIDEO, f"{TWO_FPS}; vLLM 0.33's next-token reads stop at images"),),
        ),
        Architecture(
            "Qwen3_5MoeForConditionalGeneration",
            TRANSFORMERS,
            prepare_forward=reset_rope_deltas,
            media=IMAGES_AND_VIDEOS,
            mm_token_type_ids=True,
            media_notes=((VIDEO, f"{TWO_FPS}; vLLM 0.33's next-token reads stop at images"),),
        ),
        Architecture("Gemma4ForCausalLM", TRANSFORMERS),
        Architecture(
            "Gemma4ForConditionalGeneration",
            TRANSFORMERS,
            media=IMAGES,
            media_notes=((VIDEO, "not served: the seeds list no Gemma4 video reads"),),
        ),
        Architecture(
            "Lfm2VlForConditionalGeneration",
            TRANSFORMERS,
            media=IMAGES,
            image_area_cap=1024 * 1024,
            media_notes=((IMAGE, "shrunk to 1024² px by area"),),
        ),
        # The seeds give it "T + I + V"; transformers' model reads images only (DiffusionGemmaEncoderModel: a vision
        # tower and `pixel_values`, no video or audio input), so videos are refused rather than read another way.
        Architecture(
            "DiffusionGemmaForBlockDiffusion",
            TRANSFORMERS,
            reads=CANVAS,
            media=IMAGES,
            mm_token_type_ids=True,
            media_notes=(
                (IMAGE, "per question and joint canvases"),
                (VIDEO, "transformers' model encodes images only"),
            ),
        ),
    )
}


@dataclass(frozen=True)
class JointSchemaFamily:
    """A joint-schema checkpoint family: which transformers class holds its backbone, and how its media are
    processed (the reference's processor arguments)."""

    name: str
    architecture: str
    model_class: str
    media: frozenset[str]
    # The backbone's hidden states come from `module.thinker.model` (Qwen3-Omni) rather than `module.model`.
    omni: bool = False
    mm_token_type_ids: bool = False
    prepare_forward: Callable[[Any], None] | None = None
    # Passed to the processor with every medium (Clef-Omni caps image pixels at 65,536..1,048,576).
    processor_kwargs: dict[str, Any] | None = None
    # What the media table says beside a medium (as Architecture.media_notes).
    media_notes: tuple[tuple[str, str], ...] = ()


JOINT_SCHEMA_FAMILIES: dict[str, JointSchemaFamily] = {
    family.architecture: family
    for family in (
        JointSchemaFamily(
            "Clef-Flash",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5ForConditionalGeneration",
            media=IMAGES_AND_VIDEOS,
            mm_token_type_ids=True,
            prepare_forward=reset_rope_deltas,
            media_notes=((VIDEO, f"{TWO_FPS}, soundtracks ignored"), (AUDIO, "the seed refuses audio")),
        ),
        JointSchemaFamily(
            "Clef-Omni",
            "Qwen3OmniMoeForConditionalGeneration",
            "Qwen3OmniMoeForConditionalGeneration",
            media=frozenset({IMAGE, AUDIO, VIDEO}),
            omni=True,
            processor_kwargs={"images_kwargs": {"size": {"shortest_edge": 65_536, "longest_edge": 1_048_576}}},
            media_notes=(
                (IMAGE, "65,536..1,048,576 px"),
                (VIDEO, f"{TWO_FPS}, soundtrack heard when every video has one"),
                (AUDIO, "400 beside videos with soundtracks"),
            ),
        ),
    )
}


def joint_schema_family(architecture: str, folder: Path | None) -> JointSchemaFamily | None:
    """The Clef family of a folder: its architecture has one and `joint_head_config.json` sits beside config.json."""
    family = JOINT_SCHEMA_FAMILIES.get(architecture)
    if family is None or folder is None or not (folder / JOINT_HEAD_MARKER).is_file():
        return None
    return family


def model_read_kind(architecture: str, folder: Path | None) -> str:
    """The Read kind a model computes, reported in Info (the router loads the strategy of that kind): pooled for a
    joint-schema folder, else its registry entry's (next-token for every causal LM)."""
    if joint_schema_family(architecture, folder) is not None:
        return POOLED
    return lookup(architecture).reads


def lookup(architecture: str) -> Architecture:
    """The registry entry, or transformers' AutoModelForCausalLM for an architecture it does not list."""
    return ARCHITECTURES.get(architecture) or Architecture(architecture, TRANSFORMERS, AUTO_CAUSAL_LM)


def architecture_of(config: Any) -> str:
    architectures = getattr(config, "architectures", None) or [type(config).__name__]
    return str(architectures[0])


def layer_kinds(text_config: Any) -> list[str]:
    """The kind of every decoder layer, from whichever field the family's config uses; [] when it lists none."""
    for field in ("layer_types", "layers_block_type", "block_types"):
        kinds = getattr(text_config, field, None)
        if kinds:
            return [str(kind) for kind in kinds]
    if getattr(text_config, "model_type", None) in RECURRENT_MODEL_TYPES:
        return ["recurrent"] * int(getattr(text_config, "num_hidden_layers", 1) or 1)
    return []


def mask_free_kinds(text_config: Any) -> list[str]:
    """The layer kinds of this config that ignore an attention mask (sorted, once each)."""
    return sorted({kind for kind in layer_kinds(text_config) if _ignores_mask(kind)})


def _ignores_mask(kind: str) -> bool:
    # Unknown non-attention kinds count as mask-free: a wrong "hybrid" only costs speed, a wrong "attention" is wrong.
    return kind in MASK_FREE_LAYER_KINDS or not kind.endswith("attention")


def is_hybrid(text_config: Any) -> bool:
    """Has layers that ignore an attention mask (Qwen3.5 gated delta nets, LFM2 short convolutions, Mamba)."""
    return bool(mask_free_kinds(text_config))


def tree_refusal(text_config: Any) -> str | None:
    """Why one masked tree pass would not equal per-question prefills on this config, or None when it would."""
    recurrent = mask_free_kinds(text_config)
    if recurrent:
        return (
            f"layers of type {', '.join(recurrent)} run in sequence order and ignore an attention mask, "
            "so one masked pass would mix the branches of different questions"
        )
    other = sorted(set(layer_kinds(text_config)) - TREE_LAYER_KINDS)
    if other:
        return f"layers of type {', '.join(other)} need masks the tree engine does not build"
    return None


def default_engine(text_config: Any) -> str:
    """tree when one masked pass is exact, else fork (exact for every layer kind: it never relies on a mask)."""
    return "tree" if tree_refusal(text_config) is None else "fork"


def choose_engine(requested: str, architecture: str, text_config: Any, folder: Path | None = None) -> str:
    """The engine `--read-mode requested` runs for this model (in `folder`, whose marker files can make it a
    joint-schema model); refuses tree where it would be silently wrong."""
    if requested not in READ_MODES:
        raise ValueError(f"unknown read mode {requested!r}; choose {', '.join(READ_MODES)}")
    kind = model_read_kind(architecture, folder)
    if kind != NEXT_TOKEN:
        # The architecture decides these kinds' one engine; --read-mode names next-token engines only.
        if requested != "auto":
            family = joint_schema_family(architecture, folder)
            subject = family.name if family is not None else architecture
            raise EngineRefusedError(
                f"--read-mode {requested} cannot serve {subject}: {KIND_REFUSALS[kind]}. Use --read-mode auto."
            )
        return KIND_ENGINES[kind]
    if requested == "auto":
        return default_engine(text_config)
    if requested == "tree":
        reason = tree_refusal(text_config)
        if reason is not None:
            raise EngineRefusedError(
                f"--read-mode tree cannot serve {architecture}: {reason}. Use --read-mode auto (fork here) or naive."
            )
    return requested
