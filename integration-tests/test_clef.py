"""Clef-Flash and Clef-Omni through the whole stack (one launched server per fixture): `/info` names the strategy,
the prompt the router builds equals a Python rendering of spec/PROMPTS.md §6 written here (transformers' tokenizer,
each piece on its own), the answers on `/v1/systemone`, the SGLang shape and the OpenAI shape equal the shard's
head read in process on that prompt, mapped back to request order; label mass 1, usage once, refusals."""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import torch
import transformers
from conftest import HEALTH_TIMEOUT_S
from launchers import Launcher, cache_dir

FIXTURES = ("tiny-clef-flash", "tiny-clef-omni")
SYSTEM = (
    "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of that "
    "field's allowed options."
)
NOUL = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
LIMIT = 2048

REQUEST: dict[str, Any] = {
    "state": {"ticket": "Refund not received", "days": 12, "tags": ["billing", "late"], "a": {"z": 1, "b": None}},
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"tech_support": None, "billing": "payments", "sales": "new orders"},
        },
        "urgent": {"type": "noul", "instructions": "Needs a reply within the hour?", "criteria": {"true": "money"}},
        "tone": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
    },
    "chat_template_kwargs": {"enable_thinking": False},
}


def render(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def reference_prompt(tokenizer: Any, request: dict[str, Any], media: str = "") -> tuple[list[int], list[Any], list[list[int]]]:
    """§6's prompt and spans (counted from the end), and each question's request index per prompt option."""

    def tokens(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    schema = tokens("\n\nSCHEMA FIELDS:\n")
    spans, orders = [], []
    for n, (qid, q) in enumerate(request["questions"].items(), start=1):
        schema += tokens(f"\nFIELD {n}\nID: {qid}\nTYPE: {q['type']}\nINSTRUCTION: ")
        start = len(schema)
        schema += tokens(q.get("instructions") or qid)
        question_span = (start, len(schema))
        schema += tokens("\nALLOWED OPTIONS:\n")
        if q["type"] == "noul":
            criteria = {**NOUL, **{k: v for k, v in (q.get("criteria") or {}).items() if v is not None}}
            options = [(0, "true", criteria["true"]), (1, "false", criteria["false"])]
        elif q["type"] == "choice":
            options = sorted(((i, k, v) for i, (k, v) in enumerate(q["criteria"].items())), key=lambda o: o[1])
        else:
            options = [(i, str(i), level) for i, level in enumerate(q["criteria"])]
        option_spans = []
        for m, (_, option_id, description) in enumerate(options, start=1):
            schema += tokens(f"OPTION {m}: ")
            start = len(schema)
            semantics: dict[str, Any] = {"option_id": option_id}
            if description is not None:
                semantics["description"] = description
            schema += tokens(render(semantics))
            option_spans.append((start, len(schema)))
            schema += tokens("\n")
        schema += tokens("END FIELD\n")
        spans.append(({"noul": 0, "choice": 1, "score": 2}[q["type"]], question_span, option_spans))
        orders.append([i for i, _, _ in options])
    prefix = tokens(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nSTATE:\n") + (tokens(media) if media else [])
    suffix = tokens("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:")
    prompt = prefix + tokens(render(request["state"])) + schema + suffix
    end = len(schema) + len(suffix)
    questions = [
        (t, (s - end, e - end), tuple((a - end, b - end) for a, b in options)) for t, (s, e), options in spans
    ]
    return prompt, questions, orders


class InProcess:
    """The shard's own loader and engine in this process: the answers' source of truth, itself checked against
    transformers' last_hidden_state and a float64 reference of the head in server/tests/test_joint_schema.py."""

    def __init__(self, name: str) -> None:
        from decision_server.engines import make_engine
        from decision_server.model import LoadOptions, load_model

        torch.set_num_threads(1)
        self.folder = cache_dir() / "models" / name
        self.model = load_model(self.folder, LoadOptions(dtype="float32"))
        self.engine = make_engine("auto", self.model)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.folder)

    def probabilities(self, request: dict[str, Any]) -> tuple[list[list[float]], int]:
        from decision_server.engines import PooledSpec

        prompt, questions, orders = reference_prompt(self.tokenizer, request)
        outcome = self.engine.run([PooledSpec(id=0, prompt=tuple(prompt), questions=tuple(questions))]).outcomes[0]
        answers = []
        for logits, order in zip(outcome.logits, orders, strict=True):
            top = max(logits)
            exps = [math.exp(v - top) for v in logits]
            p = [0.0] * len(order)
            for k, index in enumerate(order):
                p[index] = exps[k] / sum(exps)
            answers.append(p)
        return answers, len(prompt)


@pytest.fixture(scope="module", params=FIXTURES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Launcher]]:
    from launchers import start_launcher

    model_dir = cache_dir() / "models" / request.param
    assert model_dir.joinpath("joint_head_config.json").is_file(), f"{model_dir} is missing: run `make fixtures`"
    launcher = start_launcher(
        tmp_path_factory.mktemp("clef"),
        # A small input limit keeps the truncation and refusal checks cheap (the prompt bound is the smaller of
        # it and the checkpoint's 16,384 / 64,000, unit-tested in router/src/prompt/joint_schema.rs).
        ["--model-id", str(model_dir), "--dtype", "float32", "--hostname", "127.0.0.1", "--max-input-tokens", str(LIMIT)],
        name=request.param,
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield request.param, launcher
    finally:
        launcher.stop(grace_s=20.0)


@pytest.fixture(scope="module")
def in_process(served: tuple[str, Launcher]) -> InProcess:
    return InProcess(served[0])


def test_info_names_the_clef_strategy(served: tuple[str, Launcher]) -> None:
    name, launcher = served
    info = httpx2.get(f"{launcher.url}/info", timeout=10).json()
    strategy = {"tiny-clef-flash": "clef_flash", "tiny-clef-omni": "clef_omni"}[name]
    assert (info["read_strategy"], info["engine"], info["implementation"]) == (strategy, "pooled", "transformers"), info
    assert info["prompt_format"] == {"name": "joint_schema", "version": 401}, info
    assert not info["refusals"], info


def _values(answer: dict[str, Any], kind: str, request_q: dict[str, Any]) -> list[float]:
    if kind == "noul":
        return [answer["noul"], 1 - answer["noul"]]
    probabilities = answer["probabilities"]
    if kind == "choice":
        return [probabilities[name] for name in request_q["criteria"]]
    return [probabilities[str(i)] for i in range(len(request_q["criteria"]))]


def test_systemone_equals_the_head_on_the_reference_prompt(served: tuple[str, Launcher], in_process: InProcess) -> None:
    _, launcher = served
    r = httpx2.post(f"{launcher.url}/v1/systemone", json=REQUEST, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    expected, prompt_len = in_process.probabilities(REQUEST)
    for (qid, q), p in zip(REQUEST["questions"].items(), expected, strict=True):
        got = _values(body["answers"][qid], q["type"], q)
        assert max(abs(a - b) for a, b in zip(got, p, strict=True)) < 1e-6, (qid, got, p)
    # Confidence is the chosen option's probability; usage counts the prompt once, nothing generated.
    team = body["answers"]["team"]
    assert team["confidence"] == pytest.approx(max(team["probabilities"].values()), abs=1e-12)
    assert body["answers"]["team"]["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert body["usage"] == {"input_tokens": prompt_len, "output_tokens": 0}


def test_the_sglang_shape_sends_the_reference_prompt(served: tuple[str, Launcher], in_process: InProcess) -> None:
    _, launcher = served
    sglang = {
        "input": REQUEST["state"],
        "return_prompt_token_ids": True,
        "questions": [
            {
                "id": "team",
                "type": "choice",
                "question": "Which team?",
                "options": [
                    {"name": "tech_support"},
                    {"name": "billing", "description": "payments"},
                    {"name": "sales", "description": "new orders"},
                ],
            },
            {"id": "urgent", "type": "yes_no", "question": "Needs a reply within the hour?", "yes": "money"},
            {"id": "tone", "type": "score", "levels": ["calm", "annoyed", "furious"]},
        ],
    }
    r = httpx2.post(f"{launcher.url}/v1/decisions", json=sglang, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    prompt, _, _ = reference_prompt(in_process.tokenizer, REQUEST)
    for qid in ("team", "urgent", "tone"):
        assert body["answers"][qid]["prompt_token_ids"] == prompt, qid
        assert body["answers"][qid]["label_mass"] == 1.0
    assert body["prompt_format_version"] == 401
    expected, _ = in_process.probabilities(REQUEST)
    got = [body["answers"]["team"]["probabilities"][n] for n in ("tech_support", "billing", "sales")]
    assert max(abs(a - b) for a, b in zip(got, expected[0], strict=True)) < 1e-6


def test_the_openai_shape_answers_every_type(served: tuple[str, Launcher]) -> None:
    _, launcher = served
    body = {
        "model": "m",
        "input": "The package arrived with a broken screen.",
        "questions": [
            {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
            {"type": "choice", "instructions": "Which department?", "choices": [{"value": "returns"}, {"value": "billing"}]},
            {"type": "score", "instructions": "How severe?", "levels": [{"label": "cosmetic"}, {"label": "broken"}]},
        ],
    }
    r = httpx2.post(f"{launcher.url}/v1/decisions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [a["type"] for a in out["answers"]] == ["predicate", "choice", "score"]
    assert 0.0 < out["answers"][0]["probability"] < 1.0
    assert out["usage"]["output_tokens"] == 0


def test_refusals(served: tuple[str, Launcher]) -> None:
    _, launcher = served
    r = httpx2.post(f"{launcher.url}/v1/systemone", json={**REQUEST, "instructions": "Be brief."}, timeout=60)
    assert r.status_code == 400, r.text
    assert "fixed prompt" in r.text and "instructions" in r.text
    # A schema longer than the server reads: refused, not truncated.
    many = {f"q{i}": {"type": "noul", "instructions": "word " * 300} for i in range(10)}
    r = httpx2.post(f"{launcher.url}/v1/systemone", json={"state": "x", "questions": many}, timeout=60)
    assert r.status_code in (400, 413), r.text
    assert "questions" in r.text


def test_a_long_state_is_truncated_from_its_end(served: tuple[str, Launcher]) -> None:
    _, launcher = served
    state = "lorem " * (LIMIT + 100)
    r = httpx2.post(
        f"{launcher.url}/v1/systemone",
        json={"state": state, "questions": {"u": {"type": "noul", "instructions": "Is it long?"}}},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == LIMIT


def _png() -> str:
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 255, (40, 72, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_an_image_is_read_and_counted(served: tuple[str, Launcher]) -> None:
    _, launcher = served
    text = httpx2.post(f"{launcher.url}/v1/systemone", json=REQUEST, timeout=120).json()
    r = httpx2.post(f"{launcher.url}/v1/systemone", json={**REQUEST, "images": [_png()]}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answers"]["team"]["probabilities"] != text["answers"]["team"]["probabilities"]
    assert body["usage"]["input_tokens"] > text["usage"]["input_tokens"]


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_videos_and_audio_as_the_seeds_say(served: tuple[str, Launcher]) -> None:
    """Flash: videos read (soundtracks ignored), audio a 400; Omni: audio read, and audio clips together with
    videos that all have soundtracks a 400 naming the clip."""
    from decision_server.fixtures.media_samples import audio_bytes, video_bytes

    name, launcher = served
    url = f"{launcher.url}/v1/systemone"
    text = httpx2.post(url, json=REQUEST, timeout=120).json()
    video = _data_url("video/mp4", video_bytes(8, 4, soundtrack_hertz=440.0))
    clip = _data_url("audio/wav", audio_bytes(1.0))
    r = httpx2.post(url, json={**REQUEST, "videos": [video]}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > text["usage"]["input_tokens"]
    r = httpx2.post(url, json={**REQUEST, "audio": [clip]}, timeout=300)
    if name == "tiny-clef-flash":
        assert r.status_code == 400 and "audio" in r.text, r.text
        return
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] > text["usage"]["input_tokens"]
    r = httpx2.post(url, json={**REQUEST, "audio": [clip], "videos": [video]}, timeout=300)
    assert r.status_code == 400, r.text
    assert "audio.0: audio clips cannot be read with videos that have soundtracks" in r.text
