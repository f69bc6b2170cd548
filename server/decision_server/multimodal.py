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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from decision_server.architectures import Architecture
from decision_server.engines.types import InvalidReadError
from decision_server.media import (
    IMAGE,
    VIDEO,
    DecodedVideo,
    MediaError,
    MediaItem,
    MediaPrompt,
    decode_image,
    decode_video,
)

logger = logging.getLogger(__name__)

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# Decoded media kept by content hash, up to this many bytes of pixels: the same image or video in every read of a
# request (and in requests that follow) is decoded once. A medium larger than the budget is decoded every time.
DECODED_BYTES_KEPT = 512 << 20


# Processor outputs kept per media block (see ProcessedBlock), up to this many bytes of tensors.
PROCESSED_BYTES_KEPT = 512 << 20
# Per-token processor outputs a block can be spliced with: the value every token outside the media block has.
PER_TOKEN_OUTSIDE = {"mm_token_type_ids": 0}


@dataclass(frozen=True)
class ProcessedBlock:
    """What the processor made of one media block (the prompt from its first media placeholder to its last, with the
    media it stands for): the block's expanded ids, the media tensors, and the block's slice of each per-token
    tensor. Only placeholders expand — every token outside the block comes out of the processor unchanged — so a
    prompt with the same block and media is the same expansion spliced between its own text (`splice`), without
    running the processor again."""

    ids: tuple[int, ...]
    tensors: dict[str, torch.Tensor]
    per_token: dict[str, torch.Tensor]
    media_tokens: int

    @classmethod
    def of(cls, prompt: Sequence[int], processed: MediaPrompt, start: int, end: int) -> ProcessedBlock | None:
        """The block of a processed prompt; None when the processor changed text outside it or gave a per-token
        output this splice does not know, so the prompt cannot be shared."""
        ids, tail = processed.input_ids, len(prompt) - end
        block_end = len(ids) - tail
        if tuple(ids[:start]) != tuple(prompt[:start]) or tuple(ids[block_end:]) != tuple(prompt[end:]):
            return None
        tensors, per_token = {}, {}
        for name, value in processed.tensors.items():
            if value.dim() == 2 and value.shape == (1, len(ids)):
                outside = PER_TOKEN_OUTSIDE.get(name)
                if outside is None or bool(
                    (value[0, :start] != outside).any() or (value[0, block_end:] != outside).any()
                ):
                    return None
                per_token[name] = value[:, start:block_end]
            else:
                tensors[name] = value
        return cls(
            ids=tuple(ids[start:block_end]), tensors=tensors, per_token=per_token, media_tokens=processed.media_tokens
        )

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in (*self.tensors.values(), *self.per_token.values()))

    def splice(self, prompt: Sequence[int], start: int, end: int) -> MediaPrompt:
        before, after = len(prompt[:start]), len(prompt) - end
        tensors = dict(self.tensors)
        for name, block in self.per_token.items():
            fill = PER_TOKEN_OUTSIDE[name]
            tensors[name] = torch.cat(
                (
                    torch.full((1, before), fill, dtype=block.dtype),
                    block,
                    torch.full((1, after), fill, dtype=block.dtype),
                ),
                dim=1,
            )
        ids = (*prompt[:start], *self.ids, *prompt[end:])
        return MediaPrompt(
            input_ids=ids, tensors=tensors, media_tokens=self.media_tokens, media_end=start + len(self.ids)
        )


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
        for modality, token_attr, part in (
            (IMAGE, "image_token", "image_processor"),
            (VIDEO, "video_token", "video_processor"),
        ):
            token = getattr(self.processor, token_attr, None)
            if modality in architecture.media and token is not None and getattr(self.processor, part, None) is not None:
                self.placeholders[modality] = int(self.tokenizer.convert_tokens_to_ids(token))
        self.modalities: tuple[str, ...] = tuple(sorted(self.placeholders))
        video_processor = getattr(self.processor, "video_processor", None)
        # The processor's bounds on sampled frames (Qwen3-VL: 4..768).
        self.video_frames = (
            int(getattr(video_processor, "min_frames", 4)),
            int(getattr(video_processor, "max_frames", 768)),
        )
        # Frames are patched in groups of this many: a video with fewer cannot be read.
        self.temporal_patch = int(getattr(video_processor, "temporal_patch_size", 1) or 1)
        # Whether the video processor takes `cap_pixels_per_frame` (checked once here, not per read).
        self.caps_frame_pixels = hasattr(video_processor, "cap_pixels_per_frame")
        self._decoded: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._decoded_bytes = 0
        self._blocks: OrderedDict[Any, ProcessedBlock] = OrderedDict()
        self._blocks_bytes = 0
        # One processor run per block at a time: the reads of a request arrive together on the media threads.
        self._block_locks: dict[Any, threading.Lock] = {}
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
        marks = set(self.placeholders.values())
        where = [index for index, token in enumerate(prompt) if token in marks]
        if not where:
            return self._process(prompt, text, items)
        # The media block: from the first placeholder to the last. Every question of a request has the same block
        # (the media come before the state), so the processor runs once per block and media, not once per read.
        start, end = where[0], where[-1] + 1
        key = (tuple((i.modality, i.sha256, i.max_seconds, i.max_frames) for i in items), tuple(prompt[start:end]))
        with self._lock:
            key_lock = self._block_locks.setdefault(key, threading.Lock())
        try:
            with key_lock:
                with self._lock:
                    block = self._blocks.get(key)
                    if block is not None:
                        self._blocks.move_to_end(key)
                if block is None:
                    processed = self._process(prompt, text, items)
                    block = ProcessedBlock.of(prompt, processed, start, end)
                    if block is None:
                        return processed
                    self._keep(key, block)
        finally:
            with self._lock:
                self._block_locks.pop(key, None)
        return block.splice(prompt, start, end)

    def _keep(self, key: Any, block: ProcessedBlock) -> None:
        if block.nbytes > PROCESSED_BYTES_KEPT:
            return
        with self._lock:
            if key in self._blocks:
                return
            self._blocks[key] = block
            self._blocks_bytes += block.nbytes
            while self._blocks_bytes > PROCESSED_BYTES_KEPT:
                _, dropped = self._blocks.popitem(last=False)
                self._blocks_bytes -= dropped.nbytes

    def _process(self, prompt: Sequence[int], text: str, items: Sequence[MediaItem]) -> MediaPrompt:
        """The processor over the whole prompt text and its media (decoded, or from the decoded cache)."""
        decoded = [self._decode(item) for item in items]
        images = [d for item, d in zip(items, decoded, strict=True) if item.modality == IMAGE]
        videos: list[DecodedVideo] = [d for item, d in zip(items, decoded, strict=True) if item.modality == VIDEO]
        kwargs: dict[str, Any] = {"add_special_tokens": False}
        if self.architecture.mm_token_type_ids:
            kwargs["return_mm_token_type_ids"] = True
        if videos:
            # Frames sampled already (2 fps, decode_video): the processor places them in time from the metadata.
            kwargs["video_metadata"] = [video.metadata() for video in videos]
            kwargs["do_sample_frames"] = False
            if self.caps_frame_pixels:
                # transformers' default, said out loud (it warns on every call otherwise): frames are not capped per
                # frame as qwen-vl-utils does; vLLM 0.32 calls the processor with the same default.
                kwargs["cap_pixels_per_frame"] = False
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
                    item.name,
                    f"{len(video.indices)} frame(s); this model reads videos of {self.temporal_patch} or more",
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
