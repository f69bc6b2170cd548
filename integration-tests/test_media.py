"""Images and videos on the whole stack: `images` / `videos` on `/v1/systemone` as data URLs and as http URLs the
operator allows, read by each media-capable fixture exactly as transformers reads the processor's own outputs (videos
at 2 fps), and every refusal a 4xx naming the field, position and limit while the server stays up. Fetching is
checked against a local HTTP listener started here."""

from __future__ import annotations

import base64
import http.server
import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
import torch
import transformers
from conftest import HEALTH_TIMEOUT_S
from decision_server.fixtures.media_samples import video_bytes
from launchers import Launcher, cache_dir
from PIL import Image
from reference import messages_for, question_body
from test_architectures import REQUEST, answer_probabilities, liquid_content

pytestmark = pytest.mark.local_only

MEDIA_FIXTURES = {
    # fixture: (architecture, strategy, the media /info lists)
    "tiny-lfm2-vl": ("Lfm2VlForConditionalGeneration", "liquid", ["images"]),
    "tiny-qwen3.5": ("Qwen3_5ForConditionalGeneration", "next_token", ["images", "videos"]),
    "tiny-gemma4-mm": ("Gemma4ForConditionalGeneration", "next_token", ["images"]),
}
TOL = 1e-5


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class MediaReference:
    """transformers' model class and the folder's own processor: one plain forward per question over the
    processor's outputs for the chat-templated prompt with the images before the state."""

    def __init__(self, model_dir: Path, architecture: str) -> None:
        torch.set_num_threads(1)
        self.processor = transformers.AutoProcessor.from_pretrained(model_dir)
        self.model = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32).eval()
        self.liquid = architecture.startswith("Lfm2Vl")

    @torch.inference_mode()
    def read(
        self, request: dict[str, Any], question: dict[str, Any], images: list[bytes], videos: list[bytes] = []  # noqa: B006
    ) -> tuple[list[float], float]:
        tokenizer = self.processor.tokenizer
        if self.liquid:
            content, forms = liquid_content(request, question)
            messages: list[dict[str, Any]] = [{"role": "system", "content": request["instructions"]}, {"role": "user", "content": content}]
        else:
            messages = messages_for(request, question)
            _body, labels = question_body(question)
            forms = [[label] for label in labels]
        user = messages[-1]
        parts = [*({"type": "image"} for _ in images), *({"type": "video"} for _ in videos)]
        user["content"] = [*parts, {"type": "text", "text": user["content"]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
        pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        kwargs: dict[str, Any] = {}
        if videos:
            # Every frame, decoded by transformers' own PyAV loader; the processor picks 2 fps by its own rule.
            frames, metadata = zip(*(self._video(data) for data in videos), strict=True)
            kwargs = {"videos": list(frames), "video_metadata": list(metadata), "do_sample_frames": True, "fps": 2}
        inputs = self.processor(
            images=pil or None, text=[text], return_tensors="pt", add_special_tokens=False,
            return_mm_token_type_ids=not self.liquid, **kwargs,
        )
        logprobs = torch.log_softmax(self.model(**inputs).logits[0, -1].to(torch.float64), dim=-1)
        groups = []
        for spellings in forms:
            ids: list[int] = []
            for form in spellings:
                encoded = tokenizer.encode(form, add_special_tokens=False)
                if len(encoded) == 1 and encoded[0] not in ids:
                    ids.append(encoded[0])
            groups.append(ids)
        best = torch.stack([logprobs[ids].max() for ids in groups])
        mass = float(sum(torch.exp(logprobs[ids]).sum() for ids in groups))
        return torch.softmax(best, dim=-1).tolist(), mass


    @staticmethod
    def _video(data: bytes) -> tuple[Any, Any]:
        import tempfile

        from transformers.video_utils import load_video

        with tempfile.NamedTemporaryFile(suffix=".mp4") as file:
            file.write(data)
            file.flush()
            return load_video(file.name, backend="pyav")


class Files(http.server.BaseHTTPRequestHandler):
    """Serves the test's images, a redirect to a host outside the allow-list, and a server too slow to wait for."""

    routes: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/redirect-outside"):
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/a.png")
            self.end_headers()
        elif self.path.startswith("/slow"):
            time.sleep(5)
            self.send_response(200)
            self.end_headers()
        elif self.path in self.routes:
            body = self.routes[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def files() -> Iterator[str]:
    Files.routes = {"/a.png": png(1)}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module", params=list(MEDIA_FIXTURES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Launcher]]:
    from launchers import start_launcher

    name = request.param
    model_dir = cache_dir() / "models" / name
    assert model_dir.joinpath("processor_config.json").is_file(), f"{model_dir} has no processor: run `make fixtures`"
    launcher = start_launcher(
        tmp_path_factory.mktemp("media"),
        [
            "--model-id", str(model_dir), "--dtype", "float32", "--hostname", "127.0.0.1",
            # Loopback is reachable only because it is named; `*` alone would not reach it.
            "--media-allow-hosts", "127.0.0.1", "--media-fetch-timeout-secs", "1",
            "--max-image-items", "3", "--max-media-bytes", "200000",
            "--max-video-seconds", "6", "--max-video-frames", "8",
        ],
        name=f"media_{name.replace('.', '_')}",
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield name, launcher
    finally:
        launcher.stop(grace_s=20.0)


_references: dict[str, MediaReference] = {}


def systemone(launcher: Launcher, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.post(f"{launcher.url}/v1/systemone", json=body, timeout=120)


def test_images_equal_an_independent_processor_forward(served: tuple[str, Launcher]) -> None:
    name, launcher = served
    architecture, strategy, modalities = MEDIA_FIXTURES[name]
    info = httpx2.get(f"{launcher.url}/info", timeout=10).json()
    assert info["modalities"] == modalities and info["read_strategy"] == strategy, info
    images = [png(1), png(2, 40, 120)]
    r = systemone(launcher, {**REQUEST, "images": [data_url(data) for data in images]})
    assert r.status_code == 200, r.text
    body = r.json()
    if name not in _references:
        _references[name] = MediaReference(cache_dir() / "models" / name, architecture)
    for qid, question in REQUEST["questions"].items():
        expected, mass = _references[name].read(REQUEST, question, images)
        got = answer_probabilities(body["answers"][qid], question)
        assert max(abs(a - b) for a, b in zip(got, expected)) < TOL, (qid, got, expected)
        assert abs(body["x_diagnostics"][qid]["label_mass"] - mass) < 1e-4 * max(mass, 1e-3), qid
    # Usage counts the images' tokens: more than the same request without them.
    text_only = systemone(launcher, REQUEST).json()
    assert body["usage"]["input_tokens"] > text_only["usage"]["input_tokens"]
    assert body["answers"]["team"]["probabilities"] != text_only["answers"]["team"]["probabilities"]


def test_videos_equal_an_independent_processor_forward(served: tuple[str, Launcher]) -> None:
    """An image and a video (3 s at 4 fps: 6 frames at 2 fps) before the state, every question equal to the folder's
    processor choosing the frames itself; within the operator's limits, and each limit a 400 naming it."""
    name, launcher = served
    architecture, _strategy, modalities = MEDIA_FIXTURES[name]
    image, video = png(1), video_bytes(12, 4, seed=1)
    if "videos" not in modalities:
        # A model that reads no video refuses one, naming the field (never reads the request without it).
        status, text = refusal(launcher, videos=[data_url(video, "video/mp4")])
        assert status == 400 and "videos" in text, (status, text)
        return
    r = systemone(launcher, {**REQUEST, "images": [data_url(image)], "videos": [data_url(video, "video/mp4")]})
    assert r.status_code == 200, r.text
    body = r.json()
    if name not in _references:
        _references[name] = MediaReference(cache_dir() / "models" / name, architecture)
    for qid, question in REQUEST["questions"].items():
        expected, _mass = _references[name].read(REQUEST, question, [image], [video])
        got = answer_probabilities(body["answers"][qid], question)
        assert max(abs(a - b) for a, b in zip(got, expected)) < TOL, (qid, got, expected)
    image_only = systemone(launcher, {**REQUEST, "images": [data_url(image)]}).json()
    assert body["usage"]["input_tokens"] > image_only["usage"]["input_tokens"]
    for video, limit in [(video_bytes(20, 4), "max_video_frames"), (video_bytes(28, 4), "max_video_seconds")]:
        status, text = refusal(launcher, videos=[data_url(video, "video/mp4")])
        assert status == 400 and "videos.0" in text and limit in text, (limit, status, text)


def test_an_allowed_url_reads_like_its_data_url(served: tuple[str, Launcher], files: str) -> None:
    _name, launcher = served
    by_url = systemone(launcher, {**REQUEST, "images": [f"{files}/a.png"]})
    inline = systemone(launcher, {**REQUEST, "images": [data_url(png(1))]})
    assert by_url.status_code == 200 and inline.status_code == 200, (by_url.text, inline.text)
    for qid in REQUEST["questions"]:
        assert by_url.json()["answers"][qid] == inline.json()["answers"][qid], qid


def test_openai_input_image_parts_read_like_system_one_images(served: tuple[str, Launcher]) -> None:
    """`input_image` parts on the OpenAI shape are the request's images, read before the state as on System One."""
    _name, launcher = served
    image = data_url(png(1))
    # vLLM's adapter names an option by its value's JSON text: booleans read as the System One names true/false.
    question = {"type": "choice", "instructions": "Is the refund late?", "choices": [{"value": True}, {"value": False}]}
    openai = httpx2.post(f"{launcher.url}/v1/decisions", json={"model": "m", "questions": [question], "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": image}, {"type": "input_text", "text": "Refund not received"}]},
    ]}, timeout=120)
    s1 = systemone(launcher, {"state": "Refund not received", "images": [image], "questions": {
        "team": {"type": "choice", "instructions": "Is the refund late?", "criteria": {"true": None, "false": None}}}})
    assert openai.status_code == 200 and s1.status_code == 200, (openai.text, s1.text)
    got = [p["probability"] for p in openai.json()["answers"][0]["probabilities"]]
    expected = list(s1.json()["answers"]["team"]["probabilities"].values())
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-6, (got, expected)


def refusal(launcher: Launcher, images: list[str] | None = None, **fields: Any) -> tuple[int, str]:
    """The status and body of REQUEST with `fields` (media lists) set; never slower than 10 s."""
    body = {**REQUEST, **fields}
    if images is not None:
        body["images"] = images
    started = time.monotonic()
    r = systemone(launcher, body)
    assert time.monotonic() - started < 10, "a refusal must never hang"
    return r.status_code, r.text


def test_every_bad_medium_is_a_4xx_naming_its_position(served: tuple[str, Launcher], files: str) -> None:
    _name, launcher = served
    good = data_url(png(1))
    whole = png(3, 200, 150)
    cases: list[tuple[dict[str, Any], Callable[[int, str], bool]]] = [
        ({"images": [good, data_url(b"plain words", "text/plain")]}, lambda s, t: s == 400 and "images.1" in t),
        ({"images": [data_url(b"not an image at all")]}, lambda s, t: s == 400 and "images.0" in t),
        # A good header and a cut body: the router's header check passes, the shard's decoder refuses it.
        ({"images": [good, data_url(whole[: len(whole) // 3])]}, lambda s, t: s == 400 and "images.1" in t),
        ({"images": [good] * 4}, lambda s, t: 400 <= s < 500 and "max_image_items" in t),
        ({"images": [data_url(png(5, 400, 400) + b"\0" * 200_001)]}, lambda s, t: s == 413 and "images.0" in t),
        ({"videos": [good]}, lambda s, t: s == 400 and "videos" in t),
        ({"audio": [good]}, lambda s, t: s == 400 and "audio" in t),
        ({"images": [f"{files}/missing.png"]}, lambda s, t: 400 <= s < 500 and "images.0" in t),
        ({"images": [f"{files}/redirect-outside"]}, lambda s, t: 400 <= s < 500 and "images.0" in t),
        ({"images": [f"{files}/slow"]}, lambda s, t: 400 <= s < 500 and "images.0" in t),
        ({"images": ["http://example.invalid/a.png"]}, lambda s, t: 400 <= s < 500 and "images.0" in t),
        ({"images": ["file:///etc/passwd"]}, lambda s, t: s == 400 and "images.0" in t),
    ]
    for fields, ok in cases:
        status, text = refusal(launcher, **fields)
        assert ok(status, text), (list(fields), status, text[:300])
    assert httpx2.get(f"{launcher.url}/health", timeout=10).status_code == 200
    assert systemone(launcher, {**REQUEST, "images": [good]}).status_code == 200


def test_the_sdk_image_helper_is_refused_clearly(served: tuple[str, Launcher]) -> None:
    """The TypeSafe SDK sends images as multipart assets referenced from the state, not the seed's `images` URLs:
    refused with a message saying what to send instead (never read as a text-only request)."""
    from typesafe_sdk import Image as SdkImage
    from typesafe_sdk import RetryPolicy, TypeSafeAPIError, TypeSafeClient

    _name, launcher = served
    client = TypeSafeClient(base_url=launcher.url, api_key="any", retry=RetryPolicy(max_retries=0), timeout=60)
    image = SdkImage(png(1))
    with pytest.raises(TypeSafeAPIError) as raised:
        client.system_one(state=image, questions={"q": {"type": "noul", "instructions": "Is it red?"}})
    assert raised.value.status in (400, 415), raised.value
    assert "images" in str(raised.value.body), raised.value.body
