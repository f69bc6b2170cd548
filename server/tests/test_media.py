"""Image reads through the gRPC service on the processor-carrying fixtures (LFM2-VL, Qwen3.5 dense and MoE): equal to
an independent transformers forward over the processor's own outputs, media-aware (different images never share a
result, the same image gives the same one), no state leaking into the next text read, and every bad medium refused
as FAILED_PRECONDITION naming its request position."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from conftest import running_shard
from PIL import Image

from decision_server.fixtures import make_fixture
from decision_server.media import IMAGE, MediaError, MediaItem, capped_size, decode_image
from decision_server.model import load_model
from decision_server.paths import models_dir
from decision_server.pb import decision_pb2

MEDIA_FIXTURES = ("tiny-lfm2-vl", "tiny-qwen3.5", "tiny-qwen3.5-moe")
TOL = 1e-5


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def item(data: bytes, name: str = "images.0") -> decision_pb2.MediaItem:
    return decision_pb2.MediaItem(
        modality=decision_pb2.IMAGE, data=data, sha256=hashlib.sha256(data).hexdigest(), name=name
    )


_loaded: dict[str, Any] = {}


def fixture(name: str) -> tuple[Path, Any]:
    if name not in _loaded:
        # The folder `make fixtures` builds (a no-op when it is complete).
        folder = models_dir() / name
        make_fixture(name, folder, seed=0)
        _loaded[name] = (folder, load_model(folder, dtype="float32"))
    return _loaded[name]


def prompt_ids(model: Any, images: int, text: str) -> list[int]:
    """The prompt as the router renders it: the checkpoint's template, one image part per image before the text."""
    tokenizer = model.media.tokenizer
    content: Any = [*({"type": "image"} for _ in range(images)), {"type": "text", "text": text}] if images else text
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def labels(model: Any) -> list[list[int]]:
    tokenizer = model.media.tokenizer
    return [tokenizer.encode(word, add_special_tokens=False) for word in ("A", "B", "yes")]


def read(ids: list[int], label_ids: list[list[int]], media: list[decision_pb2.MediaItem], read_id: int = 0) -> Any:
    return decision_pb2.Read(
        id=read_id,
        media=media,
        next_token=decision_pb2.NextTokenRead(
            token_ids=ids,
            labels=[
                decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=label)]) for label in label_ids
            ],
        ),
    )


def reference(model: Any, folder: Path, ids: list[int], images: list[bytes], label_ids: list[list[int]]) -> list[float]:
    """An independent forward: the folder's processor on the prompt text and images, transformers' model on its
    outputs, log-softmax at the answer position (a multi-token label: its chain of next-token log-probs)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    reference_model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    text = processor.tokenizer.decode(ids, skip_special_tokens=False)
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    values = []
    for label in label_ids:
        inputs = processor(
            images=pil or None,
            text=[text + processor.tokenizer.decode(label[:-1])],
            return_tensors="pt",
            add_special_tokens=False,
            return_mm_token_type_ids=True,
        )
        if "Lfm2" in type(reference_model).__name__:
            inputs.pop("mm_token_type_ids", None)
        with torch.inference_mode():
            logits = reference_model(**inputs).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        start = logprobs.shape[0] - len(label)
        values.append(sum(float(logprobs[start + step, token]) for step, token in enumerate(label)))
    return values


@pytest.mark.parametrize("name", MEDIA_FIXTURES)
def test_image_reads_equal_an_independent_processor_forward(name: str) -> None:
    folder, model = fixture(name)
    assert model.modalities == ("image",)
    ids = prompt_ids(model, 2, '{"ticket": "refund"}\n\nQuestion: Which?\nA: x\nB: y')
    label_ids = labels(model)
    images = [png(1), png(2, 40, 120)]
    with running_shard(model, "auto") as stub:
        info = stub.Info(decision_pb2.InfoRequest())
        assert list(info.modalities) == [decision_pb2.IMAGE]
        response = stub.Read(
            decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(images[0]), item(images[1], "images.1")])])
        )
    result = response.results[0]
    got = [group.variant_logprobs[0] for group in result.next_token.labels]
    expected = reference(model, folder, ids, images, label_ids)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < TOL, (got, expected)
    assert result.media_tokens > 0 and result.tokens_computed >= len(ids) + result.media_tokens


@pytest.mark.parametrize("name", MEDIA_FIXTURES)
def test_media_aware_sharing_and_no_state_leaks_into_text_reads(name: str) -> None:
    """Same ids, different images: different answers; the same image twice: the same answer; a text read after an
    image read (and beside one in the same batch) equals the text read alone (Qwen3.5's rope_deltas, trap 2)."""
    _folder, model = fixture(name)
    ids = prompt_ids(model, 1, "state")
    text_ids = prompt_ids(model, 0, "state")
    label_ids = labels(model)
    with running_shard(model, "auto") as stub:
        alone = stub.Read(decision_pb2.ReadRequest(reads=[read(text_ids, label_ids, [])])).results[0]
        batch = stub.Read(
            decision_pb2.ReadRequest(
                reads=[
                    read(ids, label_ids, [item(png(1))], 0),
                    read(ids, label_ids, [item(png(2))], 1),
                    read(ids, label_ids, [item(png(1))], 2),
                    read(text_ids, label_ids, [], 3),
                ]
            )
        ).results
        after = stub.Read(decision_pb2.ReadRequest(reads=[read(text_ids, label_ids, [])])).results[0]

    def lps(result: Any) -> list[float]:
        return [group.variant_logprobs[0] for group in result.next_token.labels]

    assert [r.id for r in batch] == [0, 1, 2, 3]
    assert lps(batch[0]) != lps(batch[1])
    assert lps(batch[0]) == lps(batch[2])
    assert max(abs(a - b) for a, b in zip(lps(batch[3]), lps(alone), strict=True)) < TOL
    assert max(abs(a - b) for a, b in zip(lps(after), lps(alone), strict=True)) < TOL
    assert batch[3].media_tokens == 0 and alone.media_tokens == 0


def test_bad_media_fail_only_their_own_read_naming_their_position() -> None:
    _folder, model = fixture("tiny-lfm2-vl")
    ids = prompt_ids(model, 1, "state")
    label_ids = labels(model)
    good = png(3)
    truncated = good[: len(good) // 2]
    wrong_hash = decision_pb2.MediaItem(modality=decision_pb2.IMAGE, data=good, sha256="0" * 64, name="images.0")
    video = decision_pb2.MediaItem(
        modality=decision_pb2.VIDEO, data=good, sha256=hashlib.sha256(good).hexdigest(), name="videos.0"
    )
    with running_shard(model, "auto") as stub:
        alone = stub.Read(decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(good)])])).results[0]
        for media, words in [
            ([item(b"this is not an image")], "images.0: not an image"),
            ([item(good), item(truncated, "images.1")], "images.1: cannot decode"),
            ([wrong_hash], "images.0: its sha256"),
            ([video], "videos.0: this model does not take video"),
        ]:
            # The bad read sits between two good ones of other requests: they are answered as if it were not there.
            results = stub.Read(
                decision_pb2.ReadRequest(
                    reads=[
                        read(ids, label_ids, [item(good)], 0),
                        read(ids, label_ids, media, 1),
                        read(ids, label_ids, [item(good)], 2),
                    ]
                )
            ).results
            assert [r.id for r in results] == [0, 1, 2]
            assert words in results[1].media_error and results[1].WhichOneof("kind") is None, results[1]
            for other in (results[0], results[2]):
                assert other.media_error == "" and list(other.next_token.labels) == list(alone.next_token.labels)
        # A broken contract (more images than placeholders) is the router's bug: the whole RPC is refused.
        with pytest.raises(grpc.RpcError) as raised:
            stub.Read(decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(good), item(good, "images.1")])]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 image placeholders for 2 images" in (raised.value.details() or "")


def test_a_text_model_reads_no_media(tiny_qwen3: Any) -> None:
    with running_shard(tiny_qwen3, "tree") as stub:
        assert list(stub.Info(decision_pb2.InfoRequest()).modalities) == []
        with pytest.raises(grpc.RpcError) as raised:
            stub.Read(decision_pb2.ReadRequest(reads=[read([1, 2, 3], [[5]], [item(png(1))])]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reads no media" in (raised.value.details() or "")


def test_liquid_area_cap_goldens() -> None:
    """Liquid d1 shrinks by area to 1024·1024 px: scale = sqrt(cap / (w·h)), sides floored (values by hand)."""
    cap = 1024 * 1024
    assert capped_size(1024, 1024, cap) == (1024, 1024)
    assert capped_size(800, 600, cap) == (800, 600)
    assert capped_size(2048, 2048, cap) == (1024, 1024)
    assert capped_size(4000, 3000, cap) == (1182, 886)  # scale 0.295603…: 1182.41, 886.81
    assert capped_size(10000, 10, cap) == (10000, 10)  # 100,000 px: within the cap
    assert capped_size(100000, 20, cap) == (72407, 14)  # scale 0.724077…
    assert capped_size(1, 2_000_000, cap) == (1, 1448154)  # a side never reaches 0


def test_decode_image_caps_with_bicubic_and_refuses_non_images() -> None:
    data = png(4, 2048, 1024)
    shrunk = decode_image(MediaItem(IMAGE, data, "", "images.0"), 1024 * 1024)
    assert shrunk.size == (1448, 724)
    with Image.open(io.BytesIO(data)) as original:
        expected = original.convert("RGB").resize((1448, 724), Image.Resampling.BICUBIC)
    assert np.array_equal(np.asarray(shrunk), np.asarray(expected))
    assert decode_image(MediaItem(IMAGE, data, "", "images.0")).size == (2048, 1024)
    with pytest.raises(MediaError, match=r"images\.3: not an image"):
        decode_image(MediaItem(IMAGE, b"GIF89a-not-really", "", "images.3"))
