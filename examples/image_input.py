"""An image with the state: `images` takes URLs, and a `data:` URL carries the image in the request itself (http(s)
URLs are fetched only from hosts the operator allows). Needs a model that reads images (`/info` lists its
`modalities`), e.g. `decision-launcher --model-id` an LFM2-VL or Qwen3.5 folder.

    python examples/image_input.py --url http://127.0.0.1:3000 [--image photo.png]
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import urllib.request
import zlib
from pathlib import Path


def gradient_png(width: int = 64, height: int = 48) -> bytes:
    """A small RGB PNG made with the standard library, for when no image is given."""
    rows = b"".join(
        b"\0" + b"".join(bytes((x * 255 // width, y * 255 // height, 128)) for x in range(width)) for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--image", type=Path, help="a PNG or JPEG file (default: a generated gradient)")
    args = parser.parse_args()
    data = args.image.read_bytes() if args.image else gradient_png()
    mime = "image/jpeg" if data[:2] == b"\xff\xd8" else "image/png"
    body = {
        "state": "A photo from the returns desk.",
        "images": [f"data:{mime};base64,{base64.b64encode(data).decode()}"],
        "questions": {"damaged": {"type": "noul", "instructions": "Is the item damaged?"}},
    }
    request = urllib.request.Request(
        f"{args.url}/v1/systemone", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    print(f"damaged: P(true) = {answer['answers']['damaged']['noul']:.3f}")
    print("input tokens (image included):", answer["usage"]["input_tokens"])


if __name__ == "__main__":
    main()
