"""Small synthetic media files made offline with PyAV, for tests and benchmarks: videos whose frames are known
(frame `i` is filled with a seeded pattern of `i`), with or without a soundtrack, and tones as audio files."""

from __future__ import annotations

import io

import numpy as np


def frame_pixels(index: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """Frame `index` of a sample video: random RGB blocks from (seed, index), so frames differ visibly."""
    rng = np.random.RandomState(seed * 100_003 + index)
    blocks = (rng.rand((height + 7) // 8, (width + 7) // 8, 3) * 255).astype(np.uint8)
    return np.kron(blocks, np.ones((8, 8, 1), dtype=np.uint8))[:height, :width]


def tone(seconds: float, rate: int, hertz: float, channels: int = 1, opposite: bool = False) -> np.ndarray:
    """(channels, samples) float32: a sine at `hertz` of amplitude 0.5 on every channel, or (`opposite`) its
    negative on every second channel, so that averaging the channels cancels it."""
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.5 * np.sin(2 * np.pi * hertz * t)
    return np.stack([-wave if opposite and c % 2 else wave for c in range(channels)]).astype(np.float32)


def video_bytes(
    frames: int,
    fps: int,
    width: int = 64,
    height: int = 48,
    *,
    seed: int = 0,
    codec: str = "mpeg4",
    container: str = "mp4",
    soundtrack_hertz: float | None = None,
) -> bytes:
    """A video of `frames` frames at `fps` (codec mpeg4 in mp4 by default; `libvpx-vp9` in `webm` works too),
    with a stereo AAC tone as its soundtrack when `soundtrack_hertz` is set."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=container) as box:
        stream = box.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio = None
        if soundtrack_hertz is not None:
            audio = box.add_stream("aac" if container == "mp4" else "libopus", rate=48000)
            audio.layout = "stereo"
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(index, width, height, seed), format="rgb24")
            for packet in stream.encode(frame):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
        if audio is not None and soundtrack_hertz is not None:
            samples = av.AudioFrame.from_ndarray(
                tone(frames / fps, 48000, soundtrack_hertz, 2), format="fltp", layout="stereo"
            )
            samples.sample_rate = 48000
            for packet in audio.encode(samples):
                box.mux(packet)
            for packet in audio.encode():
                box.mux(packet)
    return out.getvalue()


def audio_bytes(
    seconds: float, rate: int = 44100, hertz: float = 440.0, channels: int = 1, opposite: bool = False
) -> bytes:
    """A WAV file (16-bit PCM) of a tone (see `tone`)."""
    import av

    layout = "mono" if channels == 1 else "stereo"
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as box:
        stream = box.add_stream("pcm_s16le", rate=rate)
        stream.layout = layout
        samples = av.AudioFrame.from_ndarray(
            tone(seconds, rate, hertz, channels, opposite), format="fltp", layout=layout
        )
        samples.sample_rate = rate
        for packet in stream.encode(samples):
            box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
    return out.getvalue()
