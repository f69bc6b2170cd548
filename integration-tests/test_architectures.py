"""Every architecture of the seed table that this build serves, from its tiny fixture folder, through the whole
stack: `/info` names strategy and engine, all three routes answer, and `/v1/systemone`'s probabilities and label
mass equal an independent transformers forward (prompts rendered here from the seed's rules, not the server's).
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import torch
import transformers

from conftest import HEALTH_TIMEOUT_S
from launchers import Launcher, cache_dir
from reference import messages_for, question_body
from wordings import assert_routes_agree, readings_on_every_route

FIXTURES = {
    # fixture: (architecture, strategy, engine)
    "tiny-qwen3.5": ("Qwen3_5ForConditionalGeneration", "next_token", "fork"),
    "tiny-qwen3.5-moe": ("Qwen3_5MoeForConditionalGeneration", "next_token", "fork"),
    "tiny-gemma4": ("Gemma4ForCausalLM", "next_token", "tree"),
    "tiny-gemma4-mm": ("Gemma4ForConditionalGeneration", "next_token", "tree"),
    "tiny-lfm2-vl": ("Lfm2VlForConditionalGeneration", "liquid", "fork"),
}

REQUEST: dict[str, Any] = {
    "state": {"ticket": "Refund not received", "days": 12, "tags": ["billing", "late"]},
    "instructions": "You route support tickets.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "payments", "tech_support": None, "sales": "new orders"},
        },
        "urgent": {"type": "noul", "instructions": "Needs a reply within the hour?", "criteria": {"true": "money is moving"}},
        "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]},
    },
}


# ---------------------------------------------------------------------------------------------------------------
# Liquid d1's prompt and label groups (spec/PROMPTS.md §5, the reference's rules), written independently of the router.


def liquid_state(state: Any) -> str:
    if state is None:
        return ""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, indent=2)


def liquid_codes(names: list[str]) -> list[str]:
    if names and all(len(n.strip()) == 1 and n.strip().isalpha() for n in names):
        return [n.strip() for n in names]
    return list(string.ascii_uppercase[: len(names)])


def liquid_content(request: dict[str, Any], question: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The user message of one question and each label's spellings, in label order."""
    instructions = question.get("instructions") or ""
    kind = question["type"]
    if kind == "choice":
        names = list(question["criteria"])
        codes = liquid_codes(names)
        lines = [
            f"{code} {question['criteria'][name] or name.replace('_', ' ')}" for code, name in zip(codes, names)
        ]
        ask = f"{instructions}\n\nOptions:\n" + "\n".join(lines) + "\n\nReply with the option code only."
        forms = [[code, " " + code] for code in codes]
    elif kind == "noul":
        criteria = question.get("criteria") or {}
        yes, no = criteria.get("true"), criteria.get("false")
        sides = f"\nYes: {yes}\nNo: {no}" if yes or no else ""
        ask = f"{instructions}{sides}\n\nReply with yes or no only."
        forms = [["yes", "Yes", "YES"], ["no", "No", "NO"]]
    else:
        levels = question["criteria"]
        legend = "\n".join(f"{i} {level}" for i, level in enumerate(levels))
        ask = f"{instructions}\n\n{legend}\n\nReply with a single digit 0-{len(levels) - 1} only."
        forms = [[str(i)] for i in range(len(levels))]
    state = liquid_state(request["state"])
    return (f"{state}\n\n\nQUESTION:\n{ask}" if state else ask), forms


# ---------------------------------------------------------------------------------------------------------------


class ArchitectureReference:
    """transformers' own model class for the folder, one plain forward per question, float64 softmax."""

    def __init__(self, model_dir: Path, architecture: str) -> None:
        torch.set_num_threads(1)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model_class = getattr(transformers, architecture)
        self.model = model_class.from_pretrained(model_dir, dtype=torch.float32).eval()

    def render(self, messages: list[dict[str, str]]) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        assert isinstance(text, str)
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @torch.inference_mode()
    def logprobs(self, prompt_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt_ids])
        positions = torch.arange(len(prompt_ids)).unsqueeze(0)
        logits = self.model(input_ids=ids, position_ids=positions).logits[0, -1].to(torch.float64)
        return torch.log_softmax(logits, dim=-1)

    def next_token_read(self, request: dict[str, Any], question: dict[str, Any]) -> tuple[list[float], float]:
        """vLLM's label check: each label appended to the prompt adds exactly one token."""
        text = self.render(messages_for(request, question))
        prompt_ids = self.encode(text)
        _body, labels = question_body(question)
        label_ids = []
        for label in labels:
            extended = self.encode(text + label)
            assert extended[:-1] == prompt_ids, f"label {label!r} is not one token after the prompt"
            label_ids.append(extended[-1])
        lp = self.logprobs(prompt_ids)[label_ids]
        return torch.softmax(lp, dim=-1).tolist(), float(torch.exp(lp).sum())

    def liquid_read(self, request: dict[str, Any], question: dict[str, Any]) -> tuple[list[float], float]:
        content, forms = liquid_content(request, question)
        messages = [{"role": "system", "content": request["instructions"]}, {"role": "user", "content": content}]
        logprobs = self.logprobs(self.encode(self.render(messages)))
        groups = []
        for spellings in forms:
            ids = []
            for form in spellings:
                encoded = self.encode(form)
                if len(encoded) == 1 and encoded[0] not in ids:
                    ids.append(encoded[0])
            groups.append(ids)
        best = torch.stack([logprobs[ids].max() for ids in groups])
        mass = float(sum(torch.exp(logprobs[ids]).sum() for ids in groups))
        return torch.softmax(best, dim=-1).tolist(), mass


def answer_probabilities(answer: dict[str, Any], question: dict[str, Any]) -> list[float]:
    if question["type"] == "noul":
        return [answer["noul"], 1.0 - answer["noul"]]
    return list(answer["probabilities"].values())


@pytest.fixture(scope="module", params=list(FIXTURES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Launcher]]:
    from launchers import start_launcher

    name = request.param
    model_dir = cache_dir() / "models" / name
    assert model_dir.joinpath("config.json").is_file(), f"{model_dir} is missing: run `make fixtures`"
    launcher = start_launcher(
        tmp_path_factory.mktemp("arch"),
        ["--model-id", str(model_dir), "--dtype", "float32", "--matmul", "exact", "--hostname", "127.0.0.1"],
        name=name.replace(".", "_"),
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield name, launcher
    finally:
        launcher.stop(grace_s=20.0)


def test_info_names_architecture_strategy_and_engine(served: tuple[str, Launcher]) -> None:
    name, launcher = served
    info = httpx2.get(f"{launcher.url}/info", timeout=10).json()
    architecture, strategy, engine = FIXTURES[name]
    assert (info["architecture"], info["read_strategy"], info["engine"]) == (architecture, strategy, engine), info
    assert info["implementation"] == "transformers"
    assert info["refusals"] == {} or not info["refusals"], info
    expected_format = {"name": "liquid_d1", "version": 201} if strategy == "liquid" else {"name": "vllm", "version": 101}
    assert info["prompt_format"] == expected_format, info


def test_systemone_equals_an_independent_transformers_forward(served: tuple[str, Launcher]) -> None:
    name, launcher = served
    architecture, strategy, _engine = FIXTURES[name]
    reference = ArchitectureReference(cache_dir() / "models" / name, architecture)
    r = httpx2.post(f"{launcher.url}/v1/systemone", json=REQUEST, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    read: Callable[[dict[str, Any], dict[str, Any]], tuple[list[float], float]] = (
        reference.liquid_read if strategy == "liquid" else reference.next_token_read
    )
    for qid, question in REQUEST["questions"].items():
        expected, mass = read(REQUEST, question)
        got = answer_probabilities(body["answers"][qid], question)
        assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5, (qid, got, expected)
        assert math.isclose(body["x_diagnostics"][qid]["label_mass"], mass, rel_tol=1e-4, abs_tol=1e-7), qid


def test_decisions_routes_answer_in_both_shapes(served: tuple[str, Launcher]) -> None:
    _name, launcher = served
    openai_shape = {
        "model": "m",
        "input": "Refund not received after 12 days.",
        "questions": [
            {"type": "predicate", "instructions": "Is it urgent?", "name": "urgent"},
            {"type": "choice", "instructions": "Which team?", "choices": [{"value": "billing"}, {"value": "tech"}]},
            {"type": "score", "instructions": "How upset?", "levels": [{"label": "calm"}, {"label": "furious"}]},
        ],
    }
    r = httpx2.post(f"{launcher.url}/v1/decisions", json=openai_shape, timeout=120)
    assert r.status_code == 200, r.text
    assert [a["type"] for a in r.json()["answers"]] == ["predicate", "choice", "score"]
    sglang_shape = {
        "input": "Refund not received after 12 days.",
        "questions": [
            {"id": "team", "type": "choice", "question": "Which team?", "options": [{"name": "billing"}, {"name": "tech"}]},
            {"id": "urgent", "type": "yes_no", "question": "Is it urgent?"},
            {"id": "tone", "type": "score", "question": "How upset?", "levels": ["calm", "furious"]},
        ],
    }
    r = httpx2.post(f"{launcher.url}/v1/decisions", json=sglang_shape, timeout=120)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert abs(sum(answers["team"]["probabilities"].values()) - 1.0) < 1e-9
    # The strategy's wording on every shape: the version reported is the one /info names.
    info = httpx2.get(f"{launcher.url}/info", timeout=10).json()
    assert r.json()["prompt_format_version"] == info["prompt_format"]["version"]
    with httpx2.Client(base_url=launcher.url, timeout=120) as client:
        assert_routes_agree(readings_on_every_route(client))


def test_media_fields_are_read_or_refused_naming_the_field(served: tuple[str, Launcher]) -> None:
    name, launcher = served
    pixel = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    # The fixtures that ship their processor read images (as the reference's next-token and Liquid reads do), Qwen3.5
    # videos too (a one-pixel PNG is no video: refused naming videos.0); none reads audio; a folder without a
    # processor reads no media at all.
    takes_images = name in ("tiny-qwen3.5", "tiny-qwen3.5-moe", "tiny-lfm2-vl", "tiny-gemma4-mm")
    takes_videos = name in ("tiny-qwen3.5", "tiny-qwen3.5-moe")
    info = httpx2.get(f"{launcher.url}/info", timeout=10).json()
    expected = (["images"] if takes_images else []) + (["videos"] if takes_videos else [])
    assert info["modalities"] == expected, info
    for field in ("images", "videos", "audio"):
        r = httpx2.post(f"{launcher.url}/v1/systemone", json={**REQUEST, field: [pixel]}, timeout=60)
        if field == "images" and takes_images:
            assert r.status_code == 200, r.text
            continue
        assert r.status_code == 400, (field, r.text)
        assert field in r.text, r.text
    if takes_images:
        # Started without --media-allow-hosts: only data URLs are read, an http URL is refused by position.
        r = httpx2.post(
            f"{launcher.url}/v1/systemone", json={**REQUEST, "images": [pixel, "http://127.0.0.1:9/a.png"]}, timeout=60
        )
        assert r.status_code == 400 and "images.1" in r.text, r.text


def test_a_marked_folder_is_never_read_as_plain_qwen3_5(tmp_path: Path) -> None:
    """A Clef-Flash folder is a Qwen3.5 folder plus its head: it must never be read as plain Qwen3.5. One whose head
    config is empty (and has no weights) is a startup refusal naming the file, not a next-token server."""
    from launchers import start_launcher

    source = cache_dir() / "models" / "tiny-qwen3.5"
    clef = tmp_path / "tiny-clef-flash"
    clef.mkdir()
    for item in source.iterdir():
        (clef / item.name).symlink_to(item)
    (clef / "joint_head_config.json").write_text("{}")
    launcher = start_launcher(tmp_path, ["--model-id", str(clef), "--hostname", "127.0.0.1"], name="clef")
    try:
        code = launcher.wait_exit(HEALTH_TIMEOUT_S)
        assert code not in (None, 0), launcher.output_tail()
        output = launcher.output()
        assert "joint_head_config.json" in output and "missing hidden_size" in output, launcher.output_tail()
    finally:
        launcher.stop(grace_s=20.0)


def test_joint_is_refused_by_strategies_that_read_one_question_at_a_time(served: tuple[str, Launcher]) -> None:
    _name, launcher = served
    r = httpx2.post(f"{launcher.url}/v1/systemone", json={**REQUEST, "joint": True}, timeout=60)
    assert r.status_code == 400, r.text
    assert "joint" in r.text and "reads each question on its own" in r.text, r.text
    sglang = {"input": "x", "questions": [{"id": "u", "type": "yes_no", "question": "Urgent?"}], "joint": True}
    r = httpx2.post(f"{launcher.url}/v1/decisions", json=sglang, timeout=60)
    assert r.status_code == 400 and "joint" in r.text, r.text
    # joint: false is the default everywhere.
    assert httpx2.post(f"{launcher.url}/v1/systemone", json={**REQUEST, "joint": False}, timeout=60).status_code == 200
