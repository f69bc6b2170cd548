"""GGUF export of the embedded default model, Qwen3 fixtures, and the atomic folder publishing they share."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from decision_server.atomic import MARKER_NAME, build_folder_atomically
from decision_server.export import EXPORT_FILES, export_default
from decision_server.fixtures import FIXTURE_FILES, fixture_config, make_fixture


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """name -> (size, mtime_ns, sha256 of the first MiB) for every file."""
    result = {}
    for path in sorted(folder.iterdir()):
        with path.open("rb") as handle:
            digest = hashlib.sha256(handle.read(1 << 20)).hexdigest()
        stat = path.stat()
        result[path.name] = (stat.st_size, stat.st_mtime_ns, digest)
    return result


def test_default_export_has_model_tokenizer_and_template(smollm2_dir: Path) -> None:
    for name in (*EXPORT_FILES, MARKER_NAME):
        assert (smollm2_dir / name).is_file(), name
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    template = (smollm2_dir / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    tokenizer_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == template
    assert tokenizer_config["model_max_length"] == 8192

    from safetensors import safe_open

    with safe_open(str(smollm2_dir / "model.safetensors"), framework="pt") as weights:
        embedding = weights.get_tensor("model.embed_tokens.weight")
    assert tuple(embedding.shape) == (49152, 576)
    assert str(embedding.dtype) == "torch.bfloat16"

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    rendered: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_second_export_is_quick_and_changes_nothing(smollm2_dir: Path) -> None:
    before = snapshot(smollm2_dir)
    started = time.monotonic()
    assert export_default(smollm2_dir) == smollm2_dir
    assert time.monotonic() - started < 2.0
    assert snapshot(smollm2_dir) == before
    assert not [p for p in smollm2_dir.parent.iterdir() if p.name.startswith(f".{smollm2_dir.name}.tmp")]


def test_tiny_qwen3_fixture(tiny_qwen3_dir: Path) -> None:
    for name in (*FIXTURE_FILES, "vocab.json", "merges.txt", MARKER_NAME):
        assert (tiny_qwen3_dir / name).is_file(), name
    config = json.loads((tiny_qwen3_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    expected = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
    }
    assert {key: config[key] for key in expected} == expected
    assert config["dtype"] == "float32"

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    rendered: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_fixtures_are_reproducible_and_idempotent(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    out = tmp_path / "tiny"
    assert make_fixture("tiny-qwen3", out, seed=0) is True
    from safetensors.torch import load_file

    ours, cached = load_file(str(out / "model.safetensors")), load_file(str(tiny_qwen3_dir / "model.safetensors"))
    assert ours.keys() == cached.keys()
    assert all(ours[key].equal(cached[key]) for key in ours)
    before = snapshot(out)
    assert make_fixture("tiny-qwen3", out, seed=0) is False
    assert snapshot(out) == before
    other = tmp_path / "tiny-seed1"
    make_fixture("tiny-qwen3", other, seed=1)
    assert not load_file(str(other / "model.safetensors"))["model.embed_tokens.weight"].equal(
        ours["model.embed_tokens.weight"]
    )


def test_qwen3_06b_config_is_the_real_one() -> None:
    config = fixture_config("qwen3-0.6b")
    assert {
        key: config[key]
        for key in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "tie_word_embeddings",
            "rope_theta",
            "rms_norm_eps",
            "max_position_embeddings",
        )
    } == {
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
    }
    with pytest.raises(ValueError, match="unknown fixture"):
        fixture_config("qwen3-7b")


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "model"

    def broken(tmp: Path) -> dict[str, Any]:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_folder_atomically(out, ["config.json"], broken)
    assert list(tmp_path.iterdir()) == []


def test_incomplete_folder_is_replaced_and_missing_files_refused(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("half")  # no marker: a run killed before this scheme, or hand-made

    def good(tmp: Path) -> dict[str, Any]:
        (tmp / "config.json").write_text("{}")
        return {"kind": "test"}

    assert build_folder_atomically(out, ["config.json"], good) is True
    assert (out / "config.json").read_text() == "{}"
    assert json.loads((out / MARKER_NAME).read_text()) == {"kind": "test"}

    with pytest.raises(RuntimeError, match=r"did not produce weights\.bin"):
        build_folder_atomically(tmp_path / "other", ["weights.bin"], good)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_folder_of_another_revision_is_rebuilt(tmp_path: Path) -> None:
    out = tmp_path / "model"
    builds: list[str] = []

    def build(text: str) -> Any:
        def write(tmp: Path) -> dict[str, Any]:
            builds.append(text)
            (tmp / "config.json").write_text(text)
            return {"kind": "test"}

        return write

    assert build_folder_atomically(out, ["config.json"], build("old")) is True  # before revisions existed
    assert build_folder_atomically(out, ["config.json"], build("v2"), revision=2) is True
    assert (out / "config.json").read_text() == "v2"
    assert json.loads((out / MARKER_NAME).read_text()) == {"kind": "test", "revision": 2}
    assert build_folder_atomically(out, ["config.json"], build("again"), revision=2) is False
    assert build_folder_atomically(out, ["config.json"], build("v3"), revision=3) is True
    assert builds == ["old", "v2", "v3"]


def test_makefile_checks_the_clef_fixture_revision() -> None:
    """`make fixtures` skips a cached Clef folder by its marker's revision; it must be the builder's."""
    from decision_server.fixtures.clef import CLEF_FIXTURE_REVISION

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert f"CLEF_FIXTURE_REVISION := {CLEF_FIXTURE_REVISION}\n" in makefile
    assert "grep -q '\"revision\": $(CLEF_FIXTURE_REVISION)'" in makefile
