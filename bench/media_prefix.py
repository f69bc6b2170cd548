"""One request of 8 questions about one 1024x768 image, before and after issue 49 item 3: every question encoding
the image and prefilling its tokens on its own (`before`: engines/media.py's `run_media_read` per read, the old
path) against the questions sharing one encoding and one prefill of the media prefix (`after`: `run_media_reads`).
Each request is cold: the processor's decoded-image and processed-block caches are emptied first, so both arms
decode and process the image once, as a fresh request does. Arms interleave; medians.

Prints one JSON object per fixture: request_ms and forward_ms (medians) per arm and the speedups.
Run: .venv/bin/python bench/media_prefix.py [--fixtures tiny-lfm2-vl tiny-qwen3.5] [--runs 7]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from decision_server.engines import ReadSpec, make_engine
from decision_server.engines import base as engine_base
from decision_server.engines.media import run_media_read, run_media_reads
from decision_server.engines.types import BatchOutcome, ReadOutcome
from decision_server.fixtures import make_fixture
from decision_server.media import IMAGE, MediaItem
from decision_server.model import LoadOptions, load_model
from decision_server.model_base import MediaScoring
from decision_server.paths import models_dir
from PIL import Image

QUESTIONS = 8


def image(width: int = 1024, height: int = 768) -> bytes:
    pixels = (np.random.RandomState(0).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def per_read(model: MediaScoring, reads: Sequence[ReadSpec], batch: BatchOutcome) -> list[ReadOutcome]:
    """The path before: each read with media on its own, the vision tower and the media prefix every time."""
    return [run_media_read(model, read, batch) for read in reads]


def request(model: Any, engine: Any, data: bytes) -> tuple[float, float]:
    """One cold request of QUESTIONS reads: (whole request seconds, forward seconds)."""
    processor = model.media
    processor._decoded.clear()
    processor._decoded_bytes = 0
    processor._blocks.clear()
    processor._blocks_bytes = 0
    tokenizer = processor.tokenizer
    media = (MediaItem(IMAGE, data, hashlib.sha256(data).hexdigest(), "images.0"),)
    labels = tuple(tuple(tokenizer.encode(word, add_special_tokens=False)) for word in ("yes", "no", "A", "B"))
    started = time.perf_counter()
    specs = []
    for index in range(QUESTIONS):
        text = f'{{"ticket": "refund {index}", "amount": 12}}\n\nQuestion {index}: Is it about item {index}?'
        content = [{"type": "image"}, {"type": "text", "text": text}]
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        prepared = processor.prepare(index, ids, media)
        specs.append(ReadSpec(id=index, prompt=ids, labels=labels, media=media, media_prompt=prepared))
    batch = engine.run(specs)
    return time.perf_counter() - started, batch.forward_seconds


def arm(path: Callable[..., list[ReadOutcome]]) -> None:
    engine_base.run_media_reads = path  # type: ignore[attr-defined]


def bench(name: str, runs: int) -> dict[str, Any]:
    folder = models_dir() / name
    make_fixture(name, folder, seed=0)
    model: Any = load_model(folder, LoadOptions(dtype="float32"))
    engine = make_engine("auto", model)
    data = image()
    times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    paths = {"before": per_read, "after": run_media_reads}
    try:
        for warm in ("before", "after"):
            arm(paths[warm])
            request(model, engine, data)
        for _ in range(runs):
            for label in ("before", "after"):
                arm(paths[label])
                times[label].append(request(model, engine, data))
    finally:
        arm(run_media_reads)
    result: dict[str, Any] = {"fixture": name, "questions": QUESTIONS, "image": "1024x768", "runs": runs}
    for label, values in times.items():
        result[f"{label}_request_ms"] = round(statistics.median(t for t, _ in values) * 1000, 1)
        result[f"{label}_forward_ms"] = round(statistics.median(f for _, f in values) * 1000, 1)
    result["request_speedup"] = round(result["before_request_ms"] / result["after_request_ms"], 2)
    result["forward_speedup"] = round(result["before_forward_ms"] / result["after_forward_ms"], 2)
    prompt_tokens = len(model.media.prepare(0, *_one_prompt(model, data)).input_ids)
    result["expanded_prompt_tokens"] = prompt_tokens
    result["torch_threads"] = torch.get_num_threads()
    return result


def _one_prompt(model: Any, data: bytes) -> tuple[tuple[int, ...], tuple[MediaItem, ...]]:
    tokenizer = model.media.tokenizer
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    ids = tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return ids, (MediaItem(IMAGE, data, hashlib.sha256(data).hexdigest(), "images.0"),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", nargs="+", default=["tiny-lfm2-vl", "tiny-qwen3.5"])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for name in args.fixtures:
        print(json.dumps(bench(name, args.runs)), flush=True)


if __name__ == "__main__":
    main()
