"""Time to decode and process one image per fixture processor (the shard's MediaProcessor.prepare), at typical
photo sizes. Medians of 15 runs after 2 warm-ups; the decoded-image cache is cleared each run so decoding counts.
Run: .venv/bin/python bench/results/2026-12-01e/media_processing.py"""

from __future__ import annotations

import hashlib
import io
import statistics
import time

import numpy as np
from decision_server.architectures import lookup
from decision_server.media import IMAGE, MediaItem
from decision_server.multimodal import MediaProcessor
from decision_server.paths import models_dir
from PIL import Image


def jpeg(width: int, height: int) -> bytes:
    rng = np.random.RandomState(0)
    # A smooth gradient plus noise: compresses like a photo, not like random bytes.
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = np.clip(x * 0.5 + y * 0.5 + rng.randn(height, width, 3) * 12, 0, 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def main() -> None:
    for fixture, architecture in [
        ("tiny-lfm2-vl", "Lfm2VlForConditionalGeneration"),
        ("tiny-qwen3.5", "Qwen3_5ForConditionalGeneration"),
    ]:
        processor = MediaProcessor(models_dir() / fixture, lookup(architecture))
        tokenizer = processor.tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "state"}]}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for width, height in [(1024, 768), (1920, 1080), (4032, 3024)]:
            data = jpeg(width, height)
            item = MediaItem(IMAGE, data, hashlib.sha256(data).hexdigest(), "images.0")
            times = []
            for run in range(17):
                processor._decoded.clear()
                started = time.perf_counter()
                prepared = processor.prepare(0, prompt, [item])
                if run >= 2:
                    times.append(time.perf_counter() - started)
            print(
                f"{fixture:14s} {width}x{height} jpeg {len(data) / 1e6:.2f} MB: "
                f"median {statistics.median(times) * 1e3:.1f} ms, media tokens {prepared.media_tokens}"
            )


if __name__ == "__main__":
    main()
