"""Media inputs as the shard receives them (bytes the router fetched) and their decoding.

Decoding is model-independent (Pillow); the per-architecture rules (Liquid's area cap) come from the registry, and
the model's own processor turns decoded media into tensors (`multimodal.py`). A medium that cannot be decoded is
the client's fault: `MediaError` names the request field and position the router gave it."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from PIL import Image

# The proto's Modality values, by name.
IMAGE, AUDIO, VIDEO = "image", "audio", "video"


class MediaError(ValueError):
    """A media item the model cannot take as sent (undecodable, truncated, the wrong kind): a client error.

    `name` is the request position the router labelled the item with (`images.0`); the message starts with it.
    The service answers the read it belongs to with it (`ReadResult.media_error`), and the router answers that
    request with a 400 naming the position; a MediaError escaping elsewhere is FAILED_PRECONDITION."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem
        # The read it failed, once the service knows it.
        self.read_id = 0


@dataclass(frozen=True)
class MediaItem:
    modality: str
    data: bytes
    sha256: str
    # The request field and position (`images.1`), for messages.
    name: str
    # Video and audio: the longest duration the operator accepts (`--max-video-seconds`, `--max-audio-seconds`)
    # and, for video, the most frames sampled (`--max-video-frames`); 0: no limit. The router sets them.
    max_seconds: float = 0.0
    max_frames: int = 0


# Videos are read at this many frames per second (the seeds: "videos are sampled at 2 fps").
VIDEO_FPS = 2.0
# A source whose container gives no frame rate is taken as this (what transformers' Qwen3-VL processor assumes).
UNKNOWN_FPS = 24.0


@dataclass(frozen=True)
class DecodedVideo:
    """The sampled frames of one video and what its processor needs to place them in time."""

    # (frames, height, width, 3) uint8 RGB.
    frames: np.ndarray
    # The source's frame rate and frame count, and which source frames were kept.
    fps: float
    total_frames: int
    indices: tuple[int, ...]

    @property
    def duration(self) -> float:
        return self.total_frames / self.fps

    def metadata(self) -> dict[str, Any]:
        """The `video_metadata` transformers' video processors take for frames sampled already."""
        return {
            "total_num_frames": self.total_frames,
            "fps": self.fps,
            "duration": self.duration,
            "width": int(self.frames.shape[2]),
            "height": int(self.frames.shape[1]),
            "frames_indices": list(self.indices),
        }


def sample_frame_indices(
    total_frames: int, source_fps: float, fps: float = VIDEO_FPS, min_frames: int = 4, max_frames: int = 768
) -> list[int]:
    """Which source frames a video is read from: `fps` frames per second of its duration, at least `min_frames`
    and at most `max_frames` (the processor's own bounds) and never more than it has, spread evenly from the first
    frame to the last with rounding — the rule of transformers' Qwen3-VL processor and vLLM's loader for it."""
    if total_frames <= 0:
        return []
    if source_fps <= 0:
        source_fps = UNKNOWN_FPS
    count = int(total_frames / source_fps * fps)
    count = min(max(count, min_frames), max_frames, total_frames)
    return [int(i) for i in np.linspace(0, total_frames - 1, count).round().astype(int)]


@dataclass(frozen=True)
class MediaPrompt:
    """A read's prompt after the processor: expanded token ids and the tensors that go with them."""

    input_ids: tuple[int, ...]
    # Processor outputs besides the ids and the attention mask (pixel values, grids, token types, ...).
    tensors: dict[str, torch.Tensor]
    # How many tokens the placeholders grew into (the expanded length minus the router's).
    media_tokens: int
    # Where the media block ends in `input_ids` (one past its last media token), when known: the prompts of a
    # request share everything before it, so one prefill of it serves them all (engines/media.py). None: unknown,
    # the read runs on its own.
    media_end: int | None = None


def capped_size(width: int, height: int, max_area: int) -> tuple[int, int]:
    """The size an image is shrunk to so its area is at most `max_area`, keeping its aspect ratio.

    As the Liquid d1 reference does: `scale = sqrt(max_area / (w * h))`, each side floored by `int()`; an image
    within the cap keeps its size. Sides never reach 0."""
    if width * height <= max_area:
        return width, height
    scale = math.sqrt(max_area / (width * height))
    return max(1, int(width * scale)), max(1, int(height * scale))


def decode_image(item: MediaItem, max_area: int | None = None) -> Image.Image:
    """The image as RGB, fully decoded (a truncated file fails here, not in the processor), shrunk by area with
    bicubic resampling when `max_area` is set and exceeded."""
    from PIL import Image, UnidentifiedImageError

    if item.modality != IMAGE:
        raise MediaError(item.name, f"expected an image, got {item.modality}")
    try:
        with Image.open(io.BytesIO(item.data)) as opened:
            opened.load()
            image = opened.convert("RGB")
    except UnidentifiedImageError:
        raise MediaError(item.name, "not an image this server can decode (PNG, JPEG, WebP, GIF, BMP)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(item.name, f"cannot decode the image: {exc}") from None
    except Image.DecompressionBombError as exc:
        raise MediaError(item.name, f"image too large to decode: {exc}") from None
    if max_area is not None:
        size = capped_size(image.width, image.height, max_area)
        if size != image.size:
            image = image.resize(size, Image.Resampling.BICUBIC)
    return image


def _open_container(item: MediaItem, kind: str) -> Any:
    import av

    try:
        return av.open(io.BytesIO(item.data), mode="r")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise MediaError(item.name, f"not {kind} this server can decode: {exc}") from None


def _check_duration(item: MediaItem, seconds: float, flag: str, partial: bool = False) -> None:
    """Refuses an item longer than its limit; `partial`: `seconds` is only what was decoded so far."""
    if item.max_seconds > 0 and seconds > item.max_seconds:
        length = f"over {seconds:.2f} s" if partial else f"{seconds:.2f} s"
        raise MediaError(item.name, f"{length} long, over the limit of {item.max_seconds:g} s ({flag})")


def decode_video(item: MediaItem, min_frames: int = 4, max_frames: int = 768) -> DecodedVideo:
    """The video's frames sampled at 2 fps (PyAV), as RGB arrays. The duration is checked against the item's limit
    from the stream's own frame count and rate before any frame is decoded, and the sampled count against
    `max_frames` of the item (the operator's cap) — both refusals, never silent truncation. `min_frames` and
    `max_frames` are the model processor's bounds."""
    import av

    if item.modality != VIDEO:
        raise MediaError(item.name, f"expected a video, got {item.modality}")
    with _open_container(item, "a video") as container:
        if not container.streams.video:
            raise MediaError(item.name, "has no video stream")
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0) or UNKNOWN_FPS
        try:
            # Packets, not frames: counting them decodes nothing (one packet per frame for video codecs).
            total = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
        except av.error.FFmpegError as exc:
            raise MediaError(item.name, f"cannot read the video: {exc}") from None
        if total <= 0:
            raise MediaError(item.name, "has no frames")
        _check_duration(item, total / fps, "max_video_seconds")
        indices = sample_frame_indices(total, fps, VIDEO_FPS, min_frames, max_frames)
        if item.max_frames and len(indices) > item.max_frames:
            raise MediaError(
                item.name,
                f"{len(indices)} frames at {VIDEO_FPS:g} fps, over the limit of {item.max_frames} (max_video_frames)",
            )
        wanted = set(indices)
        frames: dict[int, np.ndarray] = {}
        try:
            container.seek(0)
            for position, frame in enumerate(container.decode(stream)):
                if position in wanted:
                    frames[position] = frame.to_ndarray(format="rgb24")
                if position >= indices[-1]:
                    break
        except av.error.FFmpegError as exc:
            raise MediaError(item.name, f"cannot decode the video: {exc}") from None
    # A stream that declares more frames than it decodes (a truncated file) keeps the frames it has, each
    # missing index taking the last frame before it, as vLLM's loader does; none at all is an error.
    if not frames:
        raise MediaError(item.name, "cannot decode any frame of the video")
    kept: list[np.ndarray] = []
    last = frames[min(frames)]
    for index in indices:
        last = frames.get(index, last)
        kept.append(last)
    return DecodedVideo(frames=np.stack(kept), fps=fps, total_frames=total, indices=tuple(indices))


def decode_audio(item: MediaItem, sampling_rate: int) -> np.ndarray:
    """The first audio stream (of an audio file, or a video's soundtrack) as mono float32 at `sampling_rate` Hz:
    decoded and resampled per channel by PyAV (FFmpeg's resampler), then the channels averaged (as librosa's
    `mono=True` does). The duration is checked against the
    item's limit as it decodes."""
    import av

    if item.modality not in (AUDIO, VIDEO):
        raise MediaError(item.name, f"expected audio, got {item.modality}")
    kind = "audio" if item.modality == AUDIO else "a video"
    flag = "max_audio_seconds" if item.modality == AUDIO else "max_video_seconds"
    with _open_container(item, kind) as container:
        if not container.streams.audio:
            raise MediaError(item.name, "has no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", rate=sampling_rate)
        chunks: list[np.ndarray] = []
        samples = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().mean(axis=0)
                    chunks.append(chunk)
                    samples += len(chunk)
                _check_duration(item, samples / sampling_rate, flag, partial=True)
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().mean(axis=0))
        except av.error.FFmpegError as exc:
            raise MediaError(item.name, f"cannot decode the audio: {exc}") from None
    if not chunks:
        raise MediaError(item.name, "has no audio samples")
    audio = np.concatenate(chunks).astype(np.float32)
    _check_duration(item, len(audio) / sampling_rate, flag)
    return audio


def has_audio(item: MediaItem) -> bool:
    """Whether a video carries a soundtrack (an audio stream)."""
    with _open_container(item, "a video") as container:
        return bool(container.streams.audio)
