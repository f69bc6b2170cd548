"""DiffusionGemma canvas reads through the whole stack, from the tiny-diffusiongemma fixture: `/info` names the
strategy and engine, all three question types answer single and joint on `/v1/systemone` and the SGLang shape,
and the probabilities and label mass equal an independent `DiffusionGemmaForBlockDiffusion` forward on prompts
and canvases built here from the reference's rules (vLLM 0.33's DiffusionGemmaCanvasStrategy), not the server's;
with images too (the folder's processor, the images before the state, each image block attended bidirectionally
as transformers' `generate` masks it), and videos refused saying why.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import random
import string
from collections.abc import Iterator
from typing import Any

import httpx2
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from conftest import HEALTH_TIMEOUT_S
from launchers import Launcher, cache_dir
from reference import messages_for, question_body, text_of

FIXTURE = "tiny-diffusiongemma"
THOUGHT = "<|channel>thought\n<channel|>"
JOINT_REPLY = (
    'Reply with one line per question, in order, formatted as "number: answer".'
)
LABEL_SETS = {
    "choice": list(string.ascii_uppercase),
    "noul": ["yes", "no"],
    "score": list(string.digits),
}

REQUEST: dict[str, Any] = {
    "state": {"ticket": "Refund not received", "days": 12, "tags": ["billing", "late"]},
    "instructions": "You route support tickets.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {
                "billing": "payments",
                "tech_support": None,
                "sales": "new orders",
            },
        },
        "urgent": {
            "type": "noul",
            "instructions": "Needs a reply within the hour?",
            "criteria": {"true": "money is moving"},
        },
        "tone": {
            "type": "score",
            "instructions": "How upset?",
            "criteria": ["calm", "annoyed", "furious"],
        },
    },
}


def seeded(prompt_ids: list[int]) -> random.Random:
    return random.Random(hashlib.sha256(json.dumps(prompt_ids).encode()).digest())


class CanvasReference:
    """transformers' DiffusionGemmaForBlockDiffusion, one plain forward per canvas, float64 softmax."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        folder = cache_dir() / "models" / FIXTURE
        self.processor = transformers.AutoProcessor.from_pretrained(folder)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(
            folder, dtype=torch.float32
        ).eval()
        config = json.loads((folder / "config.json").read_text())
        self.vocab, self.served = (
            config["text_config"]["vocab_size"],
            config["canvas_length"],
        )
        self.end = self.tokenizer.convert_tokens_to_ids("<turn|>")
        self.pad = self.tokenizer.pad_token_id
        self.thought = self.encode(THOUGHT)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: list[dict[str, Any]], images: int = 0) -> list[int]:
        if images:
            # One image part per image before the user's text, as every model here places them.
            user = messages[-1]
            parts = [{"type": "image"} for _ in range(images)]
            user["content"] = [*parts, {"type": "text", "text": user["content"]}]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        return self.encode(text)

    @torch.inference_mode()
    def logprobs(
        self, prompt_ids: list[int], canvas: list[int], images: list[bytes] = []  # noqa: B006 (never mutated)
    ) -> torch.Tensor:
        if not images:
            output = self.model(
                input_ids=torch.tensor([prompt_ids + self.thought]),
                decoder_input_ids=torch.tensor([canvas]),
            )
            return torch.log_softmax(output.logits[0].double(), dim=-1)
        # The processor expands the placeholders; the encoder's masks are built from the token types as
        # transformers' `generate` builds them, and the vision tower's features go in as the model takes them.
        text = self.tokenizer.decode(prompt_ids + self.thought, skip_special_tokens=False)
        pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        inputs = self.processor(images=pil, text=[text], return_tensors="pt", add_special_tokens=False)
        encoder = self.model.model.encoder
        masks = encoder.create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=torch.empty((1, inputs["input_ids"].shape[1], 0)),
            attention_mask=inputs["attention_mask"],
            cache=None,
            position_ids=None,
            mm_token_type_ids=inputs["mm_token_type_ids"],
        )
        features = encoder.get_image_features(
            inputs["pixel_values"], inputs["image_position_ids"], return_dict=True
        )
        output = self.model(
            input_ids=inputs["input_ids"],
            attention_mask=masks,
            decoder_input_ids=torch.tensor([canvas]),
            mm_encoder_outputs={"image": features},
        )
        return torch.log_softmax(output.logits[0].double(), dim=-1)

    def single(
        self, request: dict[str, Any], question: dict[str, Any], images: list[bytes] = []  # noqa: B006
    ) -> tuple[list[float], float]:
        prompt = self.prompt(messages_for(request, question), len(images))
        canvas = [seeded(prompt).randrange(self.vocab), self.end] + [self.pad] * 14
        _body, labels = question_body(question)
        ids = [self.encode(label)[0] for label in labels]
        lp = self.logprobs(prompt, canvas, images)[0, ids]
        return torch.softmax(lp, dim=-1).tolist(), float(torch.exp(lp).sum())

    def line_prefix(self, k: int, kind: str) -> list[int]:
        return self.encode(f"{k}: {LABEL_SETS[kind][0]}")[:-1]

    def chunks(self, kinds: list[str]) -> list[tuple[int, int]]:
        rows = [len(self.line_prefix(k, kind)) + 2 for k, kind in enumerate(kinds, 1)]
        n = len(rows)
        for count in range(1, n):
            size, extra = divmod(n, count)
            bounds = [i * size + min(i, extra) for i in range(count + 1)]
            spans = list(zip(bounds, bounds[1:]))
            if all(1 + sum(rows[a:b]) < self.served for a, b in spans):
                return spans
        return [(i, i + 1) for i in range(n)]

    def joint(
        self, request: dict[str, Any], images: list[bytes] = []  # noqa: B006 (never mutated)
    ) -> dict[str, tuple[list[float], float]]:
        questions = list(request["questions"].items())
        answers: dict[str, tuple[list[float], float]] = {}
        for a, b in self.chunks([q["type"] for _, q in questions]):
            blocks = []
            for k, (_, q) in enumerate(questions[a:b], a + 1):
                body, _ = question_body({**q, "instructions": None})
                head = (
                    f"Question {k}: {text_of(q['instructions'])}"
                    if q.get("instructions")
                    else f"Question {k}:"
                )
                blocks.append(f"{head}\n{body}")
            content = (
                f"{text_of(request['state'])}\n\n"
                + "\n\n".join(blocks)
                + f"\n\n{JOINT_REPLY}"
            )
            messages = [{"role": "user", "content": content}]
            if request.get("instructions"):
                messages.insert(
                    0, {"role": "system", "content": request["instructions"]}
                )
            prompt = self.prompt(messages, len(images))
            rng = seeded(prompt)
            canvas: list[int] = []
            slots = []
            for k, (qid, q) in enumerate(questions[a:b], a + 1):
                canvas += self.line_prefix(k, q["type"])
                _, labels = question_body(q)
                groups = [
                    list(
                        dict.fromkeys([self.encode(f"{k}: {x}")[-1], self.encode(x)[0]])
                    )
                    for x in labels
                ]
                slots.append((qid, len(canvas), groups))
                canvas += [rng.randrange(self.vocab), *self.encode("\n")]
            canvas.append(self.end)
            width = min(-(-(len(canvas) + 1) // 16) * 16, self.served)
            canvas += [self.pad] * (width - len(canvas))
            logprobs = self.logprobs(prompt, canvas, images)
            for qid, position, groups in slots:
                best = torch.stack([logprobs[position, g].max() for g in groups])
                mass = float(
                    sum(torch.exp(logprobs[position, g]).sum() for g in groups)
                )
                answers[qid] = (torch.softmax(best, dim=-1).tolist(), mass)
        return answers


def probabilities(answer: dict[str, Any], kind: str) -> list[float]:
    if kind == "noul":
        return [answer["noul"], 1.0 - answer["noul"]]
    return list(answer["probabilities"].values())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    from launchers import start_launcher

    model_dir = cache_dir() / "models" / FIXTURE
    assert model_dir.joinpath("config.json").is_file(), (
        f"{model_dir} is missing: run `make fixtures`"
    )
    launcher = start_launcher(
        tmp_path_factory.mktemp("canvas"),
        ["--model-id", str(model_dir), "--dtype", "float32", "--hostname", "127.0.0.1"],
        name="diffusiongemma",
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield launcher
    finally:
        launcher.stop(grace_s=20.0)


@pytest.fixture(scope="module")
def reference() -> CanvasReference:
    return CanvasReference()


def test_info_names_the_canvas_strategy_and_engine(served: Launcher) -> None:
    info = httpx2.get(f"{served.url}/info", timeout=10).json()
    assert (info["architecture"], info["read_strategy"], info["engine"]) == (
        "DiffusionGemmaForBlockDiffusion",
        "diffusion_gemma_canvas",
        "canvas",
    ), info
    assert info["implementation"] == "transformers"
    assert not info["refusals"], info
    assert info["prompt_format"] == {
        "name": "diffusion_gemma_canvas",
        "version": 301,
    }, info


@pytest.mark.parametrize("joint", [False, True])
def test_systemone_equals_an_independent_forward(
    served: Launcher, reference: CanvasReference, joint: bool
) -> None:
    r = httpx2.post(
        f"{served.url}/v1/systemone", json={**REQUEST, "joint": joint}, timeout=120
    )
    assert r.status_code == 200, r.text
    body = r.json()
    expected = (
        reference.joint(REQUEST)
        if joint
        else {q: reference.single(REQUEST, v) for q, v in REQUEST["questions"].items()}
    )
    for qid, question in REQUEST["questions"].items():
        want, mass = expected[qid]
        got = probabilities(body["answers"][qid], question["type"])
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (qid, got, want)
        assert math.isclose(
            body["x_diagnostics"][qid]["label_mass"], mass, rel_tol=1e-4, abs_tol=1e-7
        ), qid
    again = httpx2.post(
        f"{served.url}/v1/systemone", json={**REQUEST, "joint": joint}, timeout=120
    ).json()
    assert again["answers"] == body["answers"], "a repeated read is bit-identical"


def test_a_long_joint_request_splits_into_even_canvases(
    served: Launcher, reference: CanvasReference
) -> None:
    kinds = ["noul", "choice", "score"]
    questions = {
        f"q{i}": {
            "type": kinds[i % 3],
            "instructions": f"Question number {i}?",
            "criteria": {
                "noul": None,
                "choice": {"a": None, "b": "bee"},
                "score": ["low", "mid", "high"],
            }[kinds[i % 3]],
        }
        for i in range(20)
    }
    request = {
        "state": "A long ticket about a refund.",
        "questions": questions,
        "joint": True,
    }
    assert len(reference.chunks([q["type"] for q in questions.values()])) > 1
    r = httpx2.post(f"{served.url}/v1/systemone", json=request, timeout=120)
    assert r.status_code == 200, r.text
    expected = reference.joint(request)
    for qid, question in questions.items():
        got = probabilities(r.json()["answers"][qid], question["type"])
        assert max(abs(a - b) for a, b in zip(got, expected[qid][0])) < 1e-5, qid


SGLANG_QUESTIONS: list[dict[str, Any]] = [
    {
        "id": "team",
        "type": "choice",
        "question": "Which team?",
        "options": [{"name": "billing", "description": "payments"}, {"name": "tech"}],
    },
    {
        "id": "urgent",
        "type": "yes_no",
        "question": "Is it urgent?",
        "no": "nothing is at stake",
    },
    {
        "id": "tone",
        "type": "score",
        "question": "How upset?",
        "levels": ["calm", "annoyed", "furious"],
    },
]
SYSTEMONE_QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "payments", "tech": None},
    },
    "urgent": {
        "type": "noul",
        "instructions": "Is it urgent?",
        "criteria": {"false": "nothing is at stake"},
    },
    "tone": {
        "type": "score",
        "instructions": "How upset?",
        "criteria": ["calm", "annoyed", "furious"],
    },
}


@pytest.mark.parametrize("joint", [False, True])
def test_the_sglang_shape_reads_as_system_one_does(
    served: Launcher, joint: bool
) -> None:
    """The strategy owns its wording: the same questions on both shapes read the same probabilities."""
    state = "Refund not received after 12 days."
    sglang = httpx2.post(
        f"{served.url}/v1/decisions",
        json={
            "input": state,
            "questions": SGLANG_QUESTIONS,
            "joint": joint,
            "prompt_format_version": 301,
        },
        timeout=120,
    )
    assert sglang.status_code == 200, sglang.text
    assert sglang.json()["prompt_format_version"] == 301
    systemone = httpx2.post(
        f"{served.url}/v1/systemone",
        json={"state": state, "questions": SYSTEMONE_QUESTIONS, "joint": joint},
        timeout=120,
    )
    assert systemone.status_code == 200, systemone.text
    sg, s1 = sglang.json()["answers"], systemone.json()["answers"]
    assert list(sg["team"]["probabilities"].values()) == pytest.approx(
        list(s1["team"]["probabilities"].values()), abs=1e-6
    )
    assert sg["urgent"]["probabilities"]["yes"] == pytest.approx(
        s1["urgent"]["noul"], abs=1e-6
    )
    assert list(sg["tone"]["probabilities"].values()) == pytest.approx(
        list(s1["tone"]["probabilities"].values()), abs=1e-6
    )


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize("joint", [False, True])
def test_images_equal_an_independent_forward(
    served: Launcher, reference: CanvasReference, joint: bool
) -> None:
    """Two images before the state, per question and on joint canvases: every probability and label mass equal
    transformers' model over the folder's processor outputs; the images change the answers and count in usage."""
    info = httpx2.get(f"{served.url}/info", timeout=10).json()
    assert info["modalities"] == ["images"], info
    images = [png(1), png(2, 40, 120)]
    body = {**REQUEST, "joint": joint, "images": [data_url(data) for data in images]}
    r = httpx2.post(f"{served.url}/v1/systemone", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got_body = r.json()
    expected = (
        reference.joint(REQUEST, images)
        if joint
        else {q: reference.single(REQUEST, v, images) for q, v in REQUEST["questions"].items()}
    )
    for qid, question in REQUEST["questions"].items():
        want, mass = expected[qid]
        got = probabilities(got_body["answers"][qid], question["type"])
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (qid, got, want)
        assert math.isclose(
            got_body["x_diagnostics"][qid]["label_mass"], mass, rel_tol=1e-4, abs_tol=1e-7
        ), qid
    text_only = httpx2.post(
        f"{served.url}/v1/systemone", json={**REQUEST, "joint": joint}, timeout=120
    ).json()
    assert got_body["usage"]["input_tokens"] > text_only["usage"]["input_tokens"]
    assert got_body["answers"] != text_only["answers"]
    other = httpx2.post(
        f"{served.url}/v1/systemone", json={**body, "images": [data_url(png(3)), body["images"][1]]}, timeout=120
    ).json()
    assert other["answers"] != got_body["answers"], "another image, other answers"


def test_an_image_that_expands_a_prompt_past_the_model_is_a_400(
    served: Launcher, reference: CanvasReference
) -> None:
    """The router checks each prompt with its image placeholder; the shard expands it. A state that fits with
    the placeholder but not with the image's tokens is a 400 naming the images, and the server goes on."""
    question = {"type": "noul", "instructions": "Urgent?"}
    request = {"state": "9", "questions": {"q": question}}
    base = len(reference.prompt(messages_for(request, question), images=1)) - 1
    # A token per digit; the router allows the prompt plus the thought block and a 16-token canvas.
    digits = 8192 - base - len(reference.thought) - 16 - 4
    body = {**request, "state": "9" * digits, "images": [data_url(png(4))]}
    r = httpx2.post(f"{served.url}/v1/systemone", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert "images: with its media expanded" in r.text and "8192 positions" in r.text, r.text
    # Without the image it fits.
    text_only = httpx2.post(f"{served.url}/v1/systemone", json={**body, "images": []}, timeout=120)
    assert text_only.status_code == 200, text_only.text


def test_refusals_name_the_field(served: Launcher) -> None:
    pixel = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    r = httpx2.post(f"{served.url}/v1/systemone", json={**REQUEST, "images": [pixel]}, timeout=60)
    assert r.status_code == 200, r.text
    for field in ("videos", "audio"):
        r = httpx2.post(
            f"{served.url}/v1/systemone", json={**REQUEST, field: [pixel]}, timeout=60
        )
        assert r.status_code == 400, (field, r.text)
        assert field in r.text, r.text
        # Why: the reference the reads equal has no such input.
        assert "encodes images only" in r.text, r.text
    r = httpx2.post(
        f"{served.url}/v1/systemone", json={**REQUEST, "joint": "yes"}, timeout=60
    )
    assert r.status_code == 422 and "joint" in r.text, r.text
    long_state = (
        "9" * 9000
    )  # a token per digit: more than the fixture's 8,192 positions
    r = httpx2.post(
        f"{served.url}/v1/systemone", json={**REQUEST, "state": long_state}, timeout=120
    )
    assert r.status_code == 400, r.text
    assert "a canvas read adds" in r.text and "positions" in r.text, r.text


def test_concurrent_requests_batch_together_and_read_as_alone(served: Launcher) -> None:
    """Requests in flight together share shard batches (one canvas read each, or several per joint canvas);
    each still reads what it reads alone."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [
        {
            **REQUEST,
            "state": f"Ticket {i}: the refund has not arrived after {i + 3} days.",
            "joint": i % 2 == 1,
        }
        for i in range(6)
    ]
    alone = [
        httpx2.post(f"{served.url}/v1/systemone", json=b, timeout=120).json()["answers"]
        for b in bodies
    ]
    before = batch_requests(served)
    with ThreadPoolExecutor(max_workers=6) as pool:
        together = list(
            pool.map(
                lambda b: httpx2.post(
                    f"{served.url}/v1/systemone", json=b, timeout=120
                ).json()["answers"],
                bodies,
            )
        )
    for one, many in zip(alone, together, strict=True):
        for qid, question in REQUEST["questions"].items():
            a, b = (
                probabilities(one[qid], question["type"]),
                probabilities(many[qid], question["type"]),
            )
            # Batched with other requests, prompts that start alike may share an encoder head (continued from a
            # copied cache rather than encoded whole): equal to float32 rounding, so the suite's 1e-5.
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, qid
    after = batch_requests(served)
    batches, requests = after[0] - before[0], after[1] - before[1]
    assert requests == len(bodies) and batches < requests, (batches, requests)


def batch_requests(served: Launcher) -> tuple[float, float]:
    """(batches, requests in them) so far, from the router's decision_batch_requests histogram."""
    values = {}
    for line in httpx2.get(f"{served.url}/metrics", timeout=10).text.splitlines():
        for suffix in ("count", "sum"):
            if line.startswith(f"decision_batch_requests_{suffix}"):
                values[suffix] = float(line.split()[-1])
    return values.get("count", 0.0), values.get("sum", 0.0)
