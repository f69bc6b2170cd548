"""DiffusionGemma canvases with images: one request of 8 per-question canvases about one 1024x768 image, each canvas
encoded alone (`alone`: the encoder and the vision tower once per canvas, what an engine without sharing does)
against the batch the router sends (`shared`: the vision tower once, the head of chat, image and state encoded once,
each canvas continuing a copy of its cache). Cold requests (the processor's caches emptied first, so both arms decode
and process the image once); arms interleave; medians.
Run: DECISION_CACHE_DIR=... .venv/bin/python bench/results/2026-12-07-media-49b/canvas_prefix.py [--runs 7]"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import time
from typing import Any

import numpy as np
import torch
from decision_server.engines import CanvasRowSpec, CanvasSpec, make_engine
from decision_server.media import IMAGE, MediaItem
from decision_server.model import LoadOptions, load_model
from decision_server.paths import models_dir
from PIL import Image

QUESTIONS = 8
THOUGHT = "<|channel>thought\n<channel|>"


def image(width: int = 1024, height: int = 768) -> bytes:
    pixels = (np.random.RandomState(0).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def request(model: Any, engine: Any, data: bytes, shared: bool) -> tuple[float, float, int]:
    """One cold request: (request seconds, forward seconds, forward passes)."""
    processor = model.media
    processor._decoded.clear()
    processor._decoded_bytes = 0
    processor._blocks.clear()
    processor._blocks_bytes = 0
    tokenizer = processor.tokenizer
    media = (MediaItem(IMAGE, data, hashlib.sha256(data).hexdigest(), "images.0"),)
    labels = tuple(tokenizer.convert_tokens_to_ids(word) for word in ("yes", "no", "A", "B"))
    end, pad = tokenizer.convert_tokens_to_ids("<turn|>"), tokenizer.pad_token_id
    started = time.perf_counter()
    specs = []
    for index in range(QUESTIONS):
        text = f'{{"ticket": "refund", "amount": 12}}\n\nQuestion {index}: Is it about item {index}?\nyes\nno'
        content = [{"type": "image"}, {"type": "text", "text": text}]
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = tuple(tokenizer(rendered + THOUGHT, add_special_tokens=False)["input_ids"])
        row = CanvasRowSpec(position=0, tokens=labels, group_sizes=(1,) * len(labels))
        spec = CanvasSpec(
            id=index, prompt=ids, canvas=(100 + index, end, *[pad] * 14), rows=(row,), media=media,
            media_prompt=processor.prepare(index, ids, media),
        )
        specs.append(spec)
    if shared:
        batches = [engine.run(specs)]
    else:
        batches = [engine.run([spec]) for spec in specs]
    elapsed = time.perf_counter() - started
    return elapsed, sum(b.forward_seconds for b in batches), sum(b.forward_passes for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    model: Any = load_model(models_dir() / "tiny-diffusiongemma", LoadOptions(dtype="float32"))
    engine = make_engine("auto", model)
    data = image()
    times: dict[str, list[tuple[float, float, int]]] = {"alone": [], "shared": []}
    for shared in (False, True):
        request(model, engine, data, shared)
    for _ in range(args.runs):
        for label in ("alone", "shared"):
            times[label].append(request(model, engine, data, label == "shared"))
    result: dict[str, Any] = {"fixture": "tiny-diffusiongemma", "questions": QUESTIONS, "image": "1024x768"}
    result["runs"] = args.runs
    for label, values in times.items():
        result[f"{label}_request_ms"] = round(statistics.median(t for t, _, _ in values) * 1000, 1)
        result[f"{label}_forward_ms"] = round(statistics.median(f for _, f, _ in values) * 1000, 1)
        result[f"{label}_forward_passes"] = values[0][2]
    result["request_speedup"] = round(result["alone_request_ms"] / result["shared_request_ms"], 2)
    result["forward_speedup"] = round(result["alone_forward_ms"] / result["shared_forward_ms"], 2)
    result["torch_threads"] = torch.get_num_threads()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
