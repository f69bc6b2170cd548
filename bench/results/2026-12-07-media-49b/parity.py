"""Parity of image reads with transformers (issue 49 items 1 and 2): the largest |shard - transformers| over every
label log-probability of a few reads, float32, CPU. Gemma4: next-token reads of tiny-gemma4-mm (2 images; 8
questions about one image in one batch, sharing its media prefill). DiffusionGemma: canvases of tiny-diffusiongemma
(2 images per question; 8 per-question canvases and a joint canvas about one image in one batch).
Run: DECISION_CACHE_DIR=... .venv/bin/python bench/results/2026-12-07-media-49b/parity.py"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "server" / "tests"))

import test_canvas as canvas  # noqa: E402
import test_media as media  # noqa: E402
from conftest import running_shard  # noqa: E402
from decision_server.engines import make_engine  # noqa: E402
from decision_server.model import LoadOptions, load_model  # noqa: E402
from decision_server.paths import models_dir  # noqa: E402
from decision_server.pb import decision_pb2  # noqa: E402

QUESTIONS = [f'{{"ticket": "refund", "n": {i}}}\n\nQuestion {i}: Which?\nA: x\nB: y' for i in range(8)]


def gemma4() -> tuple[float, int]:
    folder, model = media.fixture("tiny-gemma4-mm")
    label_ids = [*media.labels(model), model.media.tokenizer.encode(" maybe not", add_special_tokens=False)]
    two = [media.png(1), media.png(2, 40, 120)]
    one = media.png(3, 1024, 768)
    reads = [(media.prompt_ids(model, 2, QUESTIONS[0]), two)]
    reads += [(media.prompt_ids(model, 1, text), [one]) for text in QUESTIONS]
    pb = [
        media.read(ids, label_ids, [media.item(data, f"images.{k}") for k, data in enumerate(images)], index)
        for index, (ids, images) in enumerate(reads)
    ]
    with running_shard(model, "auto") as stub:
        results = stub.Read(decision_pb2.ReadRequest(reads=pb)).results
    worst, count = 0.0, 0
    for (ids, images), result in zip(reads, results, strict=True):
        got = [group.variant_logprobs[0] for group in result.next_token.labels]
        expected = media.reference(model, folder, ids, images, label_ids)
        worst = max(worst, *(abs(a - b) for a, b in zip(got, expected, strict=True)))
        count += len(got)
    return worst, count


def diffusion() -> tuple[float, int]:
    folder = models_dir() / canvas.FIXTURE
    model = load_model(folder, LoadOptions(dtype="float32"))
    reference = canvas.reference_model(folder)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    labels = [canvas.token(tokenizer, text) for text in canvas.LABELS]
    two = [canvas.png(1), canvas.png(2, 40, 120)]
    one = canvas.png(3, 1024, 768)
    cases = [(canvas.media_prompt_ids(tokenizer, 2, QUESTIONS[0]), two)]
    cases += [(canvas.media_prompt_ids(tokenizer, 1, text), [one]) for text in QUESTIONS]
    reads = [
        canvas.with_media(
            canvas.canvas_read(i, ids, canvas.single_canvas(tokenizer, 100 + i), [(0, [[t] for t in labels])]), images
        )
        for i, (ids, images) in enumerate(cases)
    ]
    with running_shard(model, make_engine("auto", model)) as stub:
        results = stub.Read(decision_pb2.ReadRequest(reads=reads)).results
    worst, count = 0.0, 0
    for (ids, images), read, result in zip(cases, reads, results, strict=True):
        expected = canvas.reference_media_logprobs(reference, folder, ids, images, list(read.canvas.canvas_ids))
        (values,) = canvas.row_values(result)
        worst = max(worst, *(abs(v - float(expected[0, t])) for v, t in zip(values, labels, strict=True)))
        count += len(values)
    return worst, count


if __name__ == "__main__":
    for name, measure in (
        ("Gemma4ForConditionalGeneration (tiny-gemma4-mm)", gemma4),
        ("DiffusionGemma canvases (tiny-diffusiongemma)", diffusion),
    ):
        worst, count = measure()
        print(f"{name}: max |shard - transformers| = {worst:.3g} over {count} label log-probabilities")
