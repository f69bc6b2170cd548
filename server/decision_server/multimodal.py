"""Media reads: a prompt's placeholder tokens and its media through the model folder's own processor
(transformers' `AutoProcessor`), into the expanded ids and tensors one forward takes.

The router renders and tokenizes the prompt with one placeholder per medium (the checkpoint's chat template writes
them); the processor expands each into the medium's tokens, exactly as it does for the reference servers. The
processor works on text, so the prompt ids are decoded and must encode back to the same ids: a prompt that does not
round-trip is refused, never read differently from what the router checked."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from decision_server.architectures import Architecture
from decision_server.engines.types import InvalidReadError
from decision_server.media import IMAGE, VIDEO, DecodedVideo, MediaError, MediaItem, MediaPrompt, decode_image, decode_video

logger = logging.getLogger(__name__)

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# Decoded media kept by content hash, up to this many bytes of pixels: the same image or video in every read of a
# request (and in requests that follow) is decoded once. A medium larger than the budget is decoded every time.
DECODED_BYTES_KEPT = 512 << 20


class MediaProcessor:
    """The processor of one model folder, for the media its architecture's reads take."""

    def __init__(self, path: Path, architecture: Architecture) -> None:
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(path)
        self.architecture = architecture
        self.tokenizer = self.processor.tokenizer
        # Each medium's placeholder token, for the media the processor takes (an image processor for images, a
        # video processor for videos) and the architecture reads.
        self.placeholders: dict[str, int] = {}
        for modality, token_attr, part in ((IMAGE, "image_token", "image_processor"), (VIDEO, "video_token", "video_processor")):
            token = getattr(self.processor, token_attr, None)
            if modality in architecture.media and token is not None and getattr(self.processor, part, None) is not None:
                self.placeholders[modality] = int(self.tokenizer.convert_tokens_to_ids(token))
        self.modalities: tuple[str, ...] = tuple(sorted(self.placeholders))
        video_processor = getattr(self.processor, "video_processor", None)
        # The processor's bounds on sampled frames (Qwen3-VL: 4..768).
        self.video_frames = (int(getattr(video_processor, "min_frames", 4)), int(getattr(video_processor, "max_frames", 768)))
        # Frames are patched in groups of this many: a video with fewer cannot be read.
        self.temporal_patch = int(getattr(video_processor, "temporal_patch_size", 1) or 1)
        self._decoded: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._decoded_bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def for_folder(cls, path: Path, architecture: Architecture) -> MediaProcessor | None:
        """The folder's processor when its architecture reads media and a processor ships beside the weights."""
        if not architecture.media or not any((path / name).is_file() for name in PROCESSOR_FILES):
            return None
        processor = cls(path, architecture)
        if not processor.modalities:
            logger.warning(
                "the folder's processor takes none of this architecture's media; reads are text only",
                extra={"fields": {"path": str(path), "architecture": architecture.name}},
            )
            return None
        return processor

    def prepare(self, read_id: int, prompt: Sequence[int], items: Sequence[MediaItem]) -> MediaPrompt:
        """The processor's ids and tensors for one read. Safe to call from several threads."""
        for item in items:
            if item.modality not in self.modalities:
                raise MediaError(item.name, f"this model does not take {item.modality} inputs")
        decoded = [self._decode(item) for item in items]
        images = [d for item, d in zip(items, decoded, strict=True) if item.modality == IMAGE]
        videos: list[DecodedVideo] = [d for item, d in zip(items, decoded, strict=True) if item.modality == VIDEO]
        for modality, token_id in self.placeholders.items():
            count = sum(1 for item in items if item.modality == modality)
            placeholders = sum(1 for token in prompt if token == token_id)
            if placeholders != count:
                raise InvalidReadError(
                    read_id, f"the prompt has {placeholders} {modality} placeholders for {count} {modality}s"
                )
        text = self.tokenizer.decode(list(prompt), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.tokenizer(text, add_special_tokens=False)["input_ids"] != list(prompt):
            raise InvalidReadError(read_id, "the prompt's ids do not decode to text that encodes back to them")
        kwargs: dict[str, Any] = {"add_special_tokens": False}
        if self.architecture.mm_token_type_ids:
            kwargs["return_mm_token_type_ids"] = True
        if videos:
            # Frames sampled already (2 fps, decode_video): the processor places them in time from the metadata.
            kwargs["video_metadata"] = [video.metadata() for video in videos]
            kwargs["do_sample_frames"] = False
        output = self.processor(
            images=images or None,
            videos=[video.frames for video in videos] or None,
            text=[text],
            return_tensors="pt",
            **kwargs,
        )
        ids = tuple(int(t) for t in output["input_ids"][0].tolist())
        tensors = {
            key: value
            for key, value in output.items()
            if key not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)
        }
        return MediaPrompt(input_ids=ids, tensors=tensors, media_tokens=len(ids) - len(prompt))

    def _decode(self, item: MediaItem) -> Any:
        """The decoded image (PIL) or video (sampled frames), from the cache when the same bytes came before.
        A video's limits are the item's, so the cache key includes them."""
        key = f"{item.modality}:{item.sha256}:{item.max_seconds}:{item.max_frames}"
        with self._lock:
            cached = self._decoded.get(key)
            if cached is not None:
                self._decoded.move_to_end(key)
                return cached[0]
        if hashlib.sha256(item.data).hexdigest() != item.sha256:
            raise MediaError(item.name, "its sha256 does not match its bytes")
        if item.modality == VIDEO:
            video = decode_video(item, *self.video_frames)
            if len(video.indices) < self.temporal_patch:
                raise MediaError(
                    item.name, f"{len(video.indices)} frame(s); this model reads videos of {self.temporal_patch} or more"
                )
            value: Any = video
            size = video.frames.nbytes
        else:
            value = decode_image(item, self.architecture.image_area_cap)
            size = value.width * value.height * 3
        if size <= DECODED_BYTES_KEPT:
            with self._lock:
                if key not in self._decoded:
                    self._decoded[key] = (value, size)
                    self._decoded_bytes += size
                while self._decoded_bytes > DECODED_BYTES_KEPT:
                    _, (_, dropped) = self._decoded.popitem(last=False)
                    self._decoded_bytes -= dropped
        return value
