"""Media inputs as the shard receives them (bytes the router fetched) and their decoding.

Decoding is model-independent (Pillow); the per-architecture rules (Liquid's area cap) come from the registry, and
the model's own processor turns decoded media into tensors (`multimodal.py`). A medium that cannot be decoded is
the client's fault: `MediaError` names the request field and position the router gave it."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


@dataclass(frozen=True)
class MediaPrompt:
    """A read's prompt after the processor: expanded token ids and the tensors that go with them."""

    input_ids: tuple[int, ...]
    # Processor outputs besides the ids and the attention mask (pixel values, grids, token types, ...).
    tensors: dict[str, torch.Tensor]
    # How many tokens the placeholders grew into (the expanded length minus the router's).
    media_tokens: int


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
