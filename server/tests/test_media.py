"""Image and video reads through the gRPC service on the processor-carrying fixtures (LFM2-VL and Gemma4 images;
Qwen3.5 dense and MoE images and videos): equal to an independent transformers forward over the processor's own outputs,
media-aware (different images never share a result, the same image gives the same one), no state leaking into the
next text read, every bad medium refused naming its request position; and the decoders' rules (area cap, 2 fps
frame choice, duration and frame limits, audio resampling) as goldens."""

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
from decision_server.fixtures.media_samples import audio_bytes, video_bytes
from decision_server.media import (
    AUDIO,
    IMAGE,
    VIDEO,
    MediaError,
    MediaItem,
    capped_size,
    decode_audio,
    decode_image,
    decode_video,
    sample_frame_indices,
)
from decision_server.model import LoadOptions, load_model
from decision_server.paths import models_dir
from decision_server.pb import decision_pb2

MEDIA_FIXTURES = ("tiny-lfm2-vl", "tiny-qwen3.5", "tiny-qwen3.5-moe", "tiny-gemma4-mm")
VIDEO_FIXTURES = ("tiny-qwen3.5", "tiny-qwen3.5-moe")
TOL = 1e-5


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def item(data: bytes, name: str = "images.0", **limits: Any) -> decision_pb2.MediaItem:
    modality = {"images": decision_pb2.IMAGE, "videos": decision_pb2.VIDEO, "audio": decision_pb2.AUDIO}
    return decision_pb2.MediaItem(
        modality=modality[name.split(".")[0]], data=data, sha256=hashlib.sha256(data).hexdigest(), name=name, **limits
    )


_loaded: dict[str, Any] = {}


def fixture(name: str) -> tuple[Path, Any]:
    if name not in _loaded:
        # The folder `make fixtures` builds (a no-op when it is complete).
        folder = models_dir() / name
        make_fixture(name, folder, seed=0)
        _loaded[name] = (folder, load_model(folder, LoadOptions(dtype="float32")))
    return _loaded[name]


def prompt_ids(model: Any, images: int, text: str, videos: int = 0) -> list[int]:
    """The prompt as the router renders it: the checkpoint's template, one image part per image and then one video
    part per video before the text."""
    tokenizer = model.media.tokenizer
    parts = [*({"type": "image"} for _ in range(images)), *({"type": "video"} for _ in range(videos))]
    content: Any = [*parts, {"type": "text", "text": text}] if parts else text
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


def every_frame(data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
    """All frames of a video, decoded in the plainest way (PyAV, frame by frame), and its metadata."""
    import av

    with av.open(io.BytesIO(data)) as box:
        stream = box.streams.video[0]
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in box.decode(stream)])
        fps = float(stream.average_rate)
    return frames, {"total_num_frames": len(frames), "fps": fps, "duration": len(frames) / fps}


def reference(
    model: Any,
    folder: Path,
    ids: list[int],
    images: list[bytes],
    label_ids: list[list[int]],
    videos: list[bytes] = [],  # noqa: B006 (never mutated)
) -> list[float]:
    """An independent forward: the folder's processor on the prompt text and media (videos: every frame, the
    processor choosing 2 fps by its own rule), transformers' model on its outputs, log-softmax at the answer
    position (a multi-token label: its chain of next-token log-probs)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    reference_model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    text = processor.tokenizer.decode(ids, skip_special_tokens=False)
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    decoded = [every_frame(data) for data in videos]
    video_kwargs: dict[str, Any] = {}
    if decoded:
        video_kwargs = {"video_metadata": [meta for _, meta in decoded], "do_sample_frames": True, "fps": 2}
    values = []
    for label in label_ids:
        inputs = processor(
            images=pil or None,
            videos=[frames for frames, _ in decoded] or None,
            text=[text + processor.tokenizer.decode(label[:-1])],
            return_tensors="pt",
            add_special_tokens=False,
            return_mm_token_type_ids=True,
            **video_kwargs,
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
    takes_video = name in VIDEO_FIXTURES
    assert model.modalities == (("image", "video") if takes_video else ("image",))
    ids = prompt_ids(model, 2, '{"ticket": "refund"}\n\nQuestion: Which?\nA: x\nB: y')
    label_ids = labels(model)
    images = [png(1), png(2, 40, 120)]
    with running_shard(model, "auto") as stub:
        info = stub.Info(decision_pb2.InfoRequest())
        assert list(info.modalities) == [decision_pb2.IMAGE, *([decision_pb2.VIDEO] if takes_video else [])]
        response = stub.Read(
            decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(images[0]), item(images[1], "images.1")])])
        )
    result = response.results[0]
    got = [group.variant_logprobs[0] for group in result.next_token.labels]
    expected = reference(model, folder, ids, images, label_ids)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < TOL, (got, expected)
    assert result.media_tokens > 0 and result.tokens_computed >= len(ids) + result.media_tokens


@pytest.mark.parametrize("name", MEDIA_FIXTURES)
def test_questions_about_one_image_share_one_encoding_and_one_media_prefill(name: str) -> None:
    """The questions of a request about one image (and a question of another request about another image, same
    ids): the vision tower runs once per distinct image of the batch, and each question, a multi-token label
    included, still equals an independent forward over its whole prompt."""
    folder, model = fixture(name)
    questions = ['{"ticket": "refund"}\n\nQuestion: Which?\nA: x\nB: y', '{"ticket": "refund"}\n\nIs it late?', "Hm"]
    prompts = [prompt_ids(model, 1, text) for text in questions]
    label_ids = [*labels(model), model.media.tokenizer.encode(" maybe not", add_special_tokens=False)]
    assert len(label_ids[-1]) > 1
    image, other = png(21, 80, 60), png(22, 80, 60)
    inner = model.module.model
    encode = inner.get_image_features
    encodings = 0

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal encodings
        encodings += 1
        return encode(*args, **kwargs)

    inner.get_image_features = counting
    try:
        with running_shard(model, "auto") as stub:
            reads = [read(ids, label_ids, [item(image)], index) for index, ids in enumerate(prompts)]
            reads.append(read(prompts[0], label_ids, [item(other)], 9))
            results = stub.Read(decision_pb2.ReadRequest(reads=reads)).results
            shared_encodings = encodings
            other_alone = stub.Read(
                decision_pb2.ReadRequest(reads=[read(prompts[0], label_ids, [item(other)], 9)])
            ).results[0]
    finally:
        del inner.get_image_features
    assert shared_encodings == 2  # one per distinct image, not one per read
    got = [[group.variant_logprobs[0] for group in r.next_token.labels] for r in results]
    for ids, values in zip(prompts, got, strict=False):
        expected = reference(model, folder, ids, [image], label_ids)
        assert max(abs(a - b) for a, b in zip(values, expected, strict=True)) < TOL, (values, expected)
    alone = [group.variant_logprobs[0] for group in other_alone.next_token.labels]
    assert got[3] != got[0] and max(abs(a - b) for a, b in zip(got[3], alone, strict=True)) < TOL
    assert all(r.media_tokens == results[0].media_tokens > 0 for r in results)


@pytest.mark.parametrize("name", VIDEO_FIXTURES)
def test_video_reads_equal_an_independent_processor_forward(name: str) -> None:
    """An image and two videos (mpeg4 in mp4, vp9 in webm) in one prompt, sampled at 2 fps: equal to the processor
    choosing the frames itself from every decoded frame; a different video changes the answer, the same one twice
    does not."""
    folder, model = fixture(name)
    ids = prompt_ids(model, 1, '{"clip": "parcel"}\n\nQuestion: Which?\nA: x\nB: y', videos=2)
    label_ids = labels(model)
    image = png(5)
    videos = [video_bytes(12, 4, seed=1), video_bytes(7, 3, 56, 40, seed=2, codec="libvpx-vp9", container="webm")]
    other = video_bytes(12, 4, seed=3)

    def media(first: bytes) -> list[decision_pb2.MediaItem]:
        return [item(image), item(first, "videos.0", max_seconds=60, max_frames=240), item(videos[1], "videos.1")]

    with running_shard(model, "auto") as stub:
        results = stub.Read(
            decision_pb2.ReadRequest(
                reads=[
                    read(ids, label_ids, media(videos[0]), 0),
                    read(ids, label_ids, media(other), 1),
                    read(ids, label_ids, media(videos[0]), 2),
                ]
            )
        ).results
        image_only = stub.Read(
            decision_pb2.ReadRequest(reads=[read(prompt_ids(model, 1, "x"), label_ids, [item(image)])])
        ).results[0]
    assert [r.media_error for r in results] == ["", "", ""]
    got = [[group.variant_logprobs[0] for group in r.next_token.labels] for r in results]
    expected = reference(model, folder, ids, [image], label_ids, videos)
    assert max(abs(a - b) for a, b in zip(got[0], expected, strict=True)) < TOL, (got[0], expected)
    assert got[0] != got[1] and got[0] == got[2]
    assert results[0].media_tokens > image_only.media_tokens > 0


def test_bad_videos_fail_only_their_own_read_naming_the_limit() -> None:
    _folder, model = fixture("tiny-qwen3.5")
    ids = prompt_ids(model, 0, "state", videos=1)
    label_ids = labels(model)
    good = video_bytes(12, 4)  # 3 s: 6 frames at 2 fps
    with running_shard(model, "auto") as stub:
        for media, words in [
            (
                item(good, "videos.0", max_seconds=2.5),
                "videos.0: 3.00 s long, over the limit of 2.5 s (max_video_seconds)",
            ),
            (
                item(good, "videos.0", max_frames=5),
                "videos.0: 6 frames at 2 fps, over the limit of 5 (max_video_frames)",
            ),
            (item(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, "videos.0"), "videos.0: not a video"),
            (item(good[: len(good) // 2], "videos.0"), "videos.0: not a video"),
            (item(audio_bytes(1.0), "videos.0"), "videos.0: has no video stream"),
            # PyAV opens a still image as a one-frame video; the model patches frames in pairs.
            (item(png(1), "videos.0"), "videos.0: 1 frame(s); this model reads videos of 2 or more"),
        ]:
            results = stub.Read(
                decision_pb2.ReadRequest(
                    reads=[read(ids, label_ids, [item(good, "videos.0")], 0), read(ids, label_ids, [media], 1)]
                )
            ).results
            assert words in results[1].media_error and results[1].WhichOneof("kind") is None, (words, results[1])
            assert results[0].media_error == "" and results[0].WhichOneof("kind") == "next_token"


def test_frame_choice_goldens_and_the_processor_rule() -> None:
    """2 fps over the duration, at least 4 and at most 768 frames, never more than the video has; an unknown rate is
    24 fps. Values by hand, then the same rule as transformers' own Qwen3-VL sampler over a grid."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    assert sample_frame_indices(12, 4.0) == [0, 2, 4, 7, 9, 11]  # 3 s: linspace(0, 11, 6) rounded
    assert sample_frame_indices(7, 3.0) == [0, 2, 4, 6]  # 2.33 s: 4 frames (int), the minimum
    assert sample_frame_indices(3, 30.0) == [0, 1, 2]  # fewer frames than the minimum: all of them
    assert sample_frame_indices(10, 0.0) == [0, 3, 6, 9]  # unknown rate: 24 fps, so the minimum of 4
    assert sample_frame_indices(300, 30.0)[:6] == [0, 16, 31, 47, 63, 79] and len(sample_frame_indices(300, 30.0)) == 20
    assert len(sample_frame_indices(100_000, 30.0)) == 768  # 3,333 s would be 6,666 frames
    assert sample_frame_indices(0, 30.0) == []
    sampler = Qwen3VLVideoProcessor()
    for total, fps in [(12, 4.0), (7, 3.0), (3, 30.0), (300, 30.0), (1001, 29.97), (61, 25.0), (100_000, 30.0)]:
        theirs = sampler.sample_frames(VideoMetadata(total_num_frames=total, fps=fps), fps=2)
        assert sample_frame_indices(total, fps) == [int(i) for i in theirs], (total, fps)


def test_decode_video_keeps_the_chosen_frames() -> None:
    data = video_bytes(12, 4, seed=7)
    video = decode_video(MediaItem(VIDEO, data, "", "videos.0"))
    frames, _ = every_frame(data)
    assert video.indices == (0, 2, 4, 7, 9, 11) and video.fps == 4.0 and video.total_frames == 12
    assert np.array_equal(video.frames, frames[list(video.indices)])
    assert video.metadata()["frames_indices"] == [0, 2, 4, 7, 9, 11] and video.metadata()["duration"] == 3.0


def test_decode_audio_resamples_to_the_rate_and_averages_channels() -> None:
    def spectrum_peak(samples: np.ndarray, rate: int) -> float:
        return float(np.abs(np.fft.rfft(samples)).argmax() * rate / len(samples))

    mono = decode_audio(MediaItem(AUDIO, audio_bytes(2.0, 44100, 440.0), "", "audio.0"), 16000)
    assert mono.dtype == np.float32 and abs(len(mono) - 32000) <= 32
    assert abs(spectrum_peak(mono, 16000) - 440.0) < 1.0 and abs(float(np.abs(mono).max()) - 0.5) < 0.01
    stereo = decode_audio(MediaItem(AUDIO, audio_bytes(2.0, 44100, 440.0, channels=2), "", "audio.0"), 16000)
    assert len(stereo) == len(mono) and float(np.abs(stereo - mono).max()) < 1e-3
    cancelled = audio_bytes(2.0, 44100, 440.0, channels=2, opposite=True)
    assert float(np.abs(decode_audio(MediaItem(AUDIO, cancelled, "", "audio.0"), 16000)).max()) < 1e-3
    too_long = r"audio\.1: over 1\.\d+ s long, over the limit of 1\.5 s \(max_audio_seconds\)"
    with pytest.raises(MediaError, match=too_long):
        decode_audio(MediaItem(AUDIO, audio_bytes(2.0), "", "audio.1", max_seconds=1.5), 16000)
    with pytest.raises(MediaError, match=r"audio\.0: not audio"):
        decode_audio(MediaItem(AUDIO, b"RIFF-but-not-really", "", "audio.0"), 16000)


def test_a_video_soundtrack_decodes_as_audio() -> None:
    from decision_server.media import has_audio

    with_sound = MediaItem(VIDEO, video_bytes(12, 4, soundtrack_hertz=300.0), "", "videos.0")
    assert has_audio(with_sound) and not has_audio(MediaItem(VIDEO, video_bytes(12, 4), "", "videos.1"))
    track = decode_audio(with_sound, 16000)
    assert abs(len(track) - 48000) <= 2048  # 3 s; AAC adds its priming and padding
    peak = float(np.abs(np.fft.rfft(track)).argmax() * 16000 / len(track))
    assert abs(peak - 300.0) < 1.0
    with pytest.raises(MediaError, match=r"videos\.1: has no audio stream"):
        decode_audio(MediaItem(VIDEO, video_bytes(12, 4), "", "videos.1"), 16000)


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
            ([item(good), item(truncated, "images.1")], "images.1: cannot decode"),  # (two placeholders below)
            ([wrong_hash], "images.0: its sha256"),
            ([video], "videos.0: this model does not take video"),
        ]:
            # The bad read sits between two good ones of other requests: they are answered as if it were not there.
            results = stub.Read(
                decision_pb2.ReadRequest(
                    reads=[
                        read(ids, label_ids, [item(good)], 0),
                        read(prompt_ids(model, len(media), "state"), label_ids, media, 1),
                        read(ids, label_ids, [item(good)], 2),
                    ]
                )
            ).results
            assert [r.id for r in results] == [0, 1, 2]
            assert words in results[1].media_error and results[1].WhichOneof("kind") is None, results[1]
            # Equal to the read alone within the float32 tolerance of every batched read here, not bit for bit: beside
            # other reads the same rows go through GEMMs of another row count, whose kernels (oneDNN picks them by
            # shape and CPU) may sum in another order (a 2-core AMD EPYC without AVX-512: 4.8e-7 apart).
            for other in (results[0], results[2]):
                assert other.media_error == "" and other.next_token.greedy_token_id == alone.next_token.greedy_token_id
                assert [lp for label in other.next_token.labels for lp in label.variant_logprobs] == pytest.approx(
                    [lp for label in alone.next_token.labels for lp in label.variant_logprobs], abs=TOL
                )
        # A broken contract (more images than placeholders) is the router's bug: the whole RPC is refused.
        with pytest.raises(grpc.RpcError) as raised:
            stub.Read(decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(good), item(good, "images.1")])]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 image placeholders for 2 images" in (raised.value.details() or "")


def test_media_that_make_a_prompt_too_long_fail_only_their_own_read() -> None:
    """The router checks a prompt's length before its placeholders expand; a read whose media take it past the
    model's positions (here a model of 400, its label included) is answered with a media error naming the field
    (a 400), the others go on."""
    import dataclasses

    from decision_server.engines import make_engine

    _folder, model = fixture("tiny-gemma4-mm")
    engine = make_engine("auto", model)
    engine.capabilities = dataclasses.replace(engine.capabilities, max_positions=400)
    label_ids = [*labels(model), model.media.tokenizer.encode(" maybe not", add_special_tokens=False)]
    ids = prompt_ids(model, 1, "state")
    with running_shard(model, engine) as stub:
        fits = stub.Read(decision_pb2.ReadRequest(reads=[read(ids, label_ids, [item(png(1))])])).results[0]
        media_tokens = fits.media_tokens
        assert fits.media_error == "" and media_tokens > 0
        filler = 400 - len(ids) - media_tokens
        long_ids = prompt_ids(model, 1, "state" + " a" * filler)
        results = stub.Read(
            decision_pb2.ReadRequest(
                reads=[read(long_ids, label_ids, [item(png(1))], 0), read(ids, label_ids, [item(png(2))], 1)]
            )
        ).results
    assert len(long_ids) < 400 < len(long_ids) + media_tokens + 1
    assert results[0].media_error == (
        f"images: with its media expanded ({media_tokens} tokens) the prompt has {len(long_ids) + media_tokens} "
        "tokens, and its longest label adds 1: more than the model's 400 positions"
    )
    assert results[1].media_error == "" and len(results[1].next_token.labels) == len(label_ids)


def test_a_text_model_reads_no_media(tiny_qwen3: Any) -> None:
    with running_shard(tiny_qwen3, "tree") as stub:
        assert list(stub.Info(decision_pb2.InfoRequest()).modalities) == []
        with pytest.raises(grpc.RpcError) as raised:
            stub.Read(decision_pb2.ReadRequest(reads=[read([1, 2, 3], [[5]], [item(png(1))])]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reads no media" in (raised.value.details() or "")


@pytest.mark.parametrize("name", ["tiny-gemma4-mm", "tiny-lfm2-vl"])
def test_an_image_model_folder_without_its_processor_reads_no_media(name: str, tmp_path: Path) -> None:
    """The image-text architecture alone is not enough: without `processor_config.json` beside the weights the shard
    reports no media (the router then refuses them naming the field) and refuses a read that carries some."""
    folder, _model = fixture(name)
    for file in folder.iterdir():
        if file.name != "processor_config.json" and file.is_file():
            (tmp_path / file.name).symlink_to(file)
    model = load_model(tmp_path, LoadOptions(dtype="float32"))
    assert model.modalities == ()
    with running_shard(model, "auto") as stub:
        assert list(stub.Info(decision_pb2.InfoRequest()).modalities) == []
        with pytest.raises(grpc.RpcError) as raised:
            stub.Read(decision_pb2.ReadRequest(reads=[read(prompt_ids(_model, 1, "x"), [[5]], [item(png(1))])]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "this model folder has no processor: it reads no media" in (raised.value.details() or "")


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


@pytest.mark.parametrize("name", MEDIA_FIXTURES)
def test_the_processor_runs_once_per_media_block_and_splices_exactly(name: str) -> None:
    """The questions of a request share their media block (placeholders before the state): the processor runs once
    for it, and every other prompt with that block gets the same expansion spliced in — equal, id for id and tensor
    for tensor, to running the processor on that prompt. Other media (or the same media in another order) run it
    again."""
    _folder, model = fixture(name)
    processor = model.media
    videos = 1 if name in VIDEO_FIXTURES else 0
    media = [MediaItem(IMAGE, png(11), hashlib.sha256(png(11)).hexdigest(), "images.0")]
    media.append(MediaItem(IMAGE, png(12, 50, 70), hashlib.sha256(png(12, 50, 70)).hexdigest(), "images.1"))
    if videos:
        clip = video_bytes(12, 4, seed=4)
        media.append(MediaItem(VIDEO, clip, hashlib.sha256(clip).hexdigest(), "videos.0", 60.0, 240))
    calls = 0
    original = processor.processor

    class Counting:
        def __getattr__(self, attribute: str) -> Any:
            return getattr(original, attribute)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return original(*args, **kwargs)

    processor.processor = Counting()
    try:
        texts = ['{"a": 1}\n\nQuestion: Which?\nA: x\nB: y', "short", "Is it late?\nReply with yes or no. " * 20]
        prompts = [prompt_ids(model, 2, text, videos=videos) for text in texts]
        spliced = [processor.prepare(index, ids, media) for index, ids in enumerate(prompts)]
        assert calls == 1
        for ids, got in zip(prompts, spliced, strict=True):
            text = processor.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            fresh = processor._process(ids, text, media)
            assert got.input_ids == fresh.input_ids and got.media_tokens == fresh.media_tokens > 0
            assert sorted(got.tensors) == sorted(fresh.tensors)
            for key, value in fresh.tensors.items():
                assert torch.equal(got.tensors[key], value), key
        calls_before = calls
        processor.prepare(9, prompts[0], [media[1], media[0], *media[2:]])
        assert calls == calls_before + 1
    finally:
        processor.processor = original
