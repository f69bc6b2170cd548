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
from decision_server.media import IMAGE, MediaError, MediaItem, MediaPrompt, decode_image

logger = logging.getLogger(__name__)

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
# Decoded images kept by content hash: the same image in every read of a request (and in requests that follow)
# is decoded once.
DECODED_IMAGES_KEPT = 64


class MediaProcessor:
    """The processor of one model folder, for the media its architecture's reads take."""

    def __init__(self, path: Path, architecture: Architecture) -> None:
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(path)
        self.architecture = architecture
        self.tokenizer = self.processor.tokenizer
        image_token = getattr(self.processor, "image_token", None)
        self.image_token_id: int | None = (
            int(self.tokenizer.convert_tokens_to_ids(image_token)) if image_token is not None else None
        )
        takes_images = getattr(self.processor, "image_processor", None) is not None and self.image_token_id is not None
        self.modalities: tuple[str, ...] = tuple(m for m in sorted(architecture.media) if m == IMAGE and takes_images)
        self._decoded: OrderedDict[str, Any] = OrderedDict()
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
        images = [self._image(item) for item in items]
        placeholders = sum(1 for token in prompt if token == self.image_token_id)
        if placeholders != len(images):
            raise InvalidReadError(
                read_id, f"the prompt has {placeholders} image placeholders for {len(images)} images"
            )
        text = self.tokenizer.decode(list(prompt), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.tokenizer(text, add_special_tokens=False)["input_ids"] != list(prompt):
            raise InvalidReadError(read_id, "the prompt's ids do not decode to text that encodes back to them")
        kwargs: dict[str, Any] = {"add_special_tokens": False}
        if self.architecture.mm_token_type_ids:
            kwargs["return_mm_token_type_ids"] = True
        output = self.processor(images=images or None, text=[text], return_tensors="pt", **kwargs)
        ids = tuple(int(t) for t in output["input_ids"][0].tolist())
        tensors = {
            key: value
            for key, value in output.items()
            if key not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)
        }
        return MediaPrompt(input_ids=ids, tensors=tensors, media_tokens=len(ids) - len(prompt))

    def _image(self, item: MediaItem) -> Any:
        with self._lock:
            cached = self._decoded.get(item.sha256)
            if cached is not None:
                self._decoded.move_to_end(item.sha256)
                return cached
        if hashlib.sha256(item.data).hexdigest() != item.sha256:
            raise MediaError(item.name, "its sha256 does not match its bytes")
        image = decode_image(item, self.architecture.image_area_cap)
        with self._lock:
            self._decoded[item.sha256] = image
            while len(self._decoded) > DECODED_IMAGES_KEPT:
                self._decoded.popitem(last=False)
        return image
