"""Time to decode and process each medium at a typical size with the shard's MediaProcessor (tiny-qwen3.5's
processor: Qwen2-VL image and Qwen3-VL video processors), and what the per-block processor cache saves for a request
of 8 questions. Medians of 7 runs after 1 warm-up; caches cleared each run so decoding counts.
Run: .venv/bin/python bench/results/2026-12-01f/media_times.py"""

from __future__ import annotations

import hashlib
import io
import statistics
import time
from collections.abc import Callable

import numpy as np
from decision_server.architectures import lookup
from decision_server.fixtures.media_samples import audio_bytes, video_bytes
from decision_server.media import AUDIO, IMAGE, VIDEO, MediaItem, decode_audio
from decision_server.multimodal import MediaProcessor
from decision_server.paths import models_dir
from PIL import Image

RUNS = 7


def jpeg(width: int, height: int) -> bytes:
    rng = np.random.RandomState(0)
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = np.clip(x * 0.5 + y * 0.5 + rng.randn(height, width, 3) * 12, 0, 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def median_ms(run: Callable[[], object]) -> float:
    times = []
    for index in range(RUNS + 1):
        started = time.perf_counter()
        run()
        if index:
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    processor = MediaProcessor(models_dir() / "tiny-qwen3.5", lookup("Qwen3_5ForConditionalGeneration"))
    tokenizer = processor.tokenizer

    def prompt(part: str, question: str) -> list[int]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": part}, {"type": "text", "text": f"state\n\n{question}"}]}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def clear() -> None:
        processor._decoded.clear()
        processor._decoded_bytes = 0
        processor._blocks.clear()
        processor._blocks_bytes = 0

    cases = [
        ("image 1024x768 JPEG", IMAGE, jpeg(1024, 768), "image"),
        ("video 10 s 640x360 30 fps mpeg4", VIDEO, video_bytes(300, 30, 640, 360), "video"),
        ("video 30 s 640x360 30 fps mpeg4", VIDEO, video_bytes(900, 30, 640, 360), "video"),
    ]
    print(
        "| medium | bytes | decode + process, one read | 8 questions, processor per read "
        "| 8 questions, per block | media tokens |"
    )
    print("|---|---|---|---|---|---|")
    for label, modality, data, part in cases:
        item = MediaItem(modality, data, hashlib.sha256(data).hexdigest(), f"{part}s.0", 60.0, 240)
        prompts = [prompt(part, f"Question {q}: is it {q}?") for q in range(8)]

        def one(prompts: list[list[int]] = prompts, item: MediaItem = item) -> None:
            clear()
            processor.prepare(0, prompts[0], [item])

        def per_block(prompts: list[list[int]] = prompts, item: MediaItem = item) -> None:
            clear()
            for ids in prompts:
                processor.prepare(0, ids, [item])

        # "per read" keeps the decoded medium (as before this change) and drops only the processed block.
        def per_read_decoded_kept(prompts: list[list[int]] = prompts, item: MediaItem = item) -> None:
            clear()
            for ids in prompts:
                processor._blocks.clear()
                processor._blocks_bytes = 0
                processor.prepare(0, ids, [item])

        tokens = processor.prepare(0, prompts[0], [item]).media_tokens
        print(
            f"| {label} | {len(data):,} | {median_ms(one):.0f} ms | {median_ms(per_read_decoded_kept):.0f} ms | "
            f"{median_ms(per_block):.0f} ms | {tokens} |"
        )
    clip = audio_bytes(10.0, 44100)
    sound = MediaItem(AUDIO, clip, "", "audio.0", 60.0)
    print(f"\naudio 10 s 44.1 kHz WAV ({len(clip):,} bytes) decoded and resampled to 16 kHz mono: "
          f"{median_ms(lambda: decode_audio(sound, 16000)):.1f} ms")


if __name__ == "__main__":
    main()
