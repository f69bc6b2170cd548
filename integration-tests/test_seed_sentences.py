"""Seed sentences as tests, one case per testable sentence (the sentence, quoted, is the case id), in the profile the
seed describes: seed 003 (SGLang's `/v1/decisions` "Errors" and its System One section) under `--compat sglang`,
seeds 000/001 (vLLM's limits, question fields, OpenAI input roles) under `--compat vllm`. Both servers read the tiny
Qwen3 fixture (real Qwen3 tokenizer and template)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import HEALTH_TIMEOUT_S
from launchers import Launcher, cache_dir, start_launcher

pytestmark = pytest.mark.local_only

YES_NO = {"id": "u", "type": "yes_no", "question": "Urgent?"}
CHOICE = {"id": "c", "type": "choice", "question": "Which team?", "options": [{"name": "billing"}, {"name": "tech"}]}
NOUL = {"type": "noul", "instructions": "Urgent?"}


def sg(*questions: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"input": "The invoice is wrong.", "questions": list(questions) or [YES_NO], **fields}


def choice(**changes: Any) -> dict[str, Any]:
    return sg({**CHOICE, **changes})


def s1(questions: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"state": "The invoice is wrong.", "questions": questions or {"q": NOUL}, **fields}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    model = cache_dir() / "models" / "tiny-qwen3"
    assert (model / "config.json").is_file(), f"{model} is missing: run `make fixtures`"
    launchers: dict[str, Launcher] = {}
    try:
        for compat in ("sglang", "vllm"):
            workdir: Path = tmp_path_factory.mktemp(compat)
            launchers[compat] = start_launcher(
                workdir, ["--model-id", str(model), "--compat", compat, "--dtype", "float32", "--hostname", "127.0.0.1"],
                name=f"seed_{compat}",
            )
        for launcher in launchers.values():
            launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield {compat: launcher.url for compat, launcher in launchers.items()}
    finally:
        for launcher in launchers.values():
            launcher.stop(grace_s=20.0)


# (sentence, profile, route, body, expected status, words the body must hold)
Check = tuple[str, str, str, dict[str, Any], int, str]
SEED_003_ERRORS: list[Check] = [
    ("003 Errors: an unknown field anywhere in the request (top level)", "sglang", "/v1/decisions", sg(extra=1), 400, '"param":"extra"'),
    ("003 Errors: an unknown field anywhere in the request (question)", "sglang", "/v1/decisions", sg({**YES_NO, "extra": 1}), 400, "questions.0.extra"),
    ("003 Errors: an unknown field anywhere in the request (option)", "sglang", "/v1/decisions",
     choice(options=[{"name": "a", "colour": 1}, {"name": "b"}]), 400, "questions.0.options.0.colour"),
    ("003 Errors: an unknown question type", "sglang", "/v1/decisions", sg({**YES_NO, "type": "ranking"}), 400, "questions.0.type"),
    ("003 Errors: option counts outside the ranges above (27)", "sglang", "/v1/decisions",
     choice(options=[{"name": f"o{i}"} for i in range(27)]), 400, "2 to 26 options"),
    ("003 Errors: level counts outside the ranges above (1)", "sglang", "/v1/decisions",
     sg({"id": "s", "type": "score", "question": "q", "levels": ["a"]}), 400, "2 to 10 levels"),
    ("003 Errors: level counts outside the ranges above (11)", "sglang", "/v1/decisions",
     sg({"id": "s", "type": "score", "question": "q", "levels": [str(i) for i in range(11)]}), 400, "2 to 10 levels"),
    ("003 Errors: a blank input", "sglang", "/v1/decisions", {**sg(), "input": "  "}, 400, '"param":"input"'),
    ("003 Errors: a blank question", "sglang", "/v1/decisions", sg({**YES_NO, "question": " "}), 400, "question 'u': question must not be blank"),
    ("003 Errors: a blank question id", "sglang", "/v1/decisions", sg({**YES_NO, "id": " "}), 400, "questions[0]: id must be a non-blank string"),
    ("003 Errors: a blank level", "sglang", "/v1/decisions",
     sg({"id": "s", "type": "score", "question": "q", "levels": ["a", " "]}), 400, "level 1 must not be blank"),
    ("003 Errors: a repeated question id", "sglang", "/v1/decisions", sg(YES_NO, YES_NO), 400, "duplicate question id 'u'"),
    ("003 Errors: option names that are blank", "sglang", "/v1/decisions", choice(options=[{"name": " "}, {"name": "b"}]), 400, "the name is blank"),
    ("003 Errors: option names that contain control or line break characters", "sglang", "/v1/decisions",
     choice(options=[{"name": "a\nb"}, {"name": "b"}]), 400, "control or line-break"),
    ("003 Errors: option names that repeat another name after trimming and case folding", "sglang", "/v1/decisions",
     choice(options=[{"name": "Billing"}, {"name": " billing "}]), 400, "repeats"),
    ("003 Errors: a prompt that does not fit the model's context length", "sglang", "/v1/decisions",
     {**sg(), "input": "word " * 6000}, 400, "max_position_embeddings"),
    ("003 Errors: chat_template_kwargs that set the thinking toggle to anything but false", "sglang", "/v1/decisions",
     sg(chat_template_kwargs={"enable_thinking": True}), 400, "thinking must be off"),
    ("003 Errors: a prompt_format_version other than the served one", "sglang", "/v1/decisions",
     sg(prompt_format_version=2), 400, "prompt_format_version"),
    ("003 Errors: a model that names a LoRA adapter", "sglang", "/v1/decisions", sg(model="base:adapter"), 400, '"param":"model"'),
    ("003 Errors: errors about one question name its id or its position in questions", "sglang", "/v1/decisions",
     sg(YES_NO, {"id": "b", "type": "score", "question": "q", "levels": ["a"]}), 400, "questions.1.levels"),
]
SEED_003_SYSTEM_ONE: list[Check] = [
    ("003 System One: the /v1/decisions fields temperature ... with any value other than null are refused", "sglang",
     "/v1/systemone", s1(temperature=1), 422, "temperature"),
    ("003 System One: ... prompt_format_version ... refused", "sglang", "/v1/systemone", s1(prompt_format_version=1), 422, "prompt_format_version"),
    ("003 System One: ... return_prompt_token_ids ... refused", "sglang", "/v1/systemone", s1(return_prompt_token_ids=False), 422,
     "return_prompt_token_ids"),
    ("003 System One: (null is accepted)", "sglang", "/v1/systemone", s1(temperature=None, prompt_format_version=None), 200, "answers"),
    ("003 System One: an empty state and empty or blank question ids are accepted", "sglang", "/v1/systemone",
     {"state": "", "questions": {"": NOUL, "  ": NOUL}}, 200, "answers"),
    ("003 System One: unknown top-level fields are ignored", "sglang", "/v1/systemone", s1(zzz=1), 200, "answers"),
    ("003 System One: unknown keys inside a question are refused", "sglang", "/v1/systemone", s1({"q": {**NOUL, "zz": 1}}), 422, "zz"),
    ("003 System One: unknown keys inside noul criteria are refused", "sglang", "/v1/systemone",
     s1({"q": {**NOUL, "criteria": {"true": "yes", "maybe": "?"}}}), 422, "maybe"),
    ("003 System One: a noul question with neither, such as the SDK's bare Noul(), is refused", "sglang", "/v1/systemone",
     s1({"q": {"type": "noul"}}), 422, "noul"),
    ("003 System One: option names ... repeat another name after trimming and case folding are refused", "sglang", "/v1/systemone",
     s1({"q": {"type": "choice", "instructions": "i", "criteria": {"Billing": None, " billing": None}}}), 422, "billing"),
    ("003 System One: invalid requests return 422, other refusals return 400 (labels beyond 26 that are not one token)", "sglang",
     "/v1/systemone", s1({"q": {"type": "choice", "instructions": "i", "criteria": {f"opt{i}": None for i in range(30)}}}), 400, "single token"),
    ("003 System One: a choice takes 1 to 255 options (256)", "sglang", "/v1/systemone",
     s1({"q": {"type": "choice", "instructions": "i", "criteria": {f"o{i}": None for i in range(256)}}}), 422, "255"),
]
SEEDS_000_001_VLLM: list[Check] = [
    ("000 Limits: questions per request 64", "vllm", "/v1/systemone", s1({f"q{i}": NOUL for i in range(65)}), 400, "at most 64 questions"),
    ("000 Limits: options per choice 26", "vllm", "/v1/systemone",
     s1({"q": {"type": "choice", "instructions": "i", "criteria": {f"o{i}": None for i in range(27)}}}), 400, "at most 26 options"),
    ("000 Limits: levels per score 10", "vllm", "/v1/systemone",
     s1({"q": {"type": "score", "instructions": "i", "criteria": [str(i) for i in range(11)]}}), 400, "at most 10 levels"),
    ("000 Question types: a score at least two levels", "vllm", "/v1/systemone",
     s1({"q": {"type": "score", "instructions": "i", "criteria": ["only"]}}), 400, "at least 2 levels"),
    ("000 Question types: a choice has at least one option", "vllm", "/v1/systemone",
     s1({"q": {"type": "choice", "instructions": "i", "criteria": {"only": None}}}), 200, "answers"),
    ("000 Request fields: a question with any field other than type, instructions and criteria is rejected with a 400", "vllm",
     "/v1/systemone", s1({"q": {**NOUL, "foo": 1}}), 400, "foo"),
    ("000 OpenAI: this MVP supports 1-64 questions", "vllm", "/v1/decisions",
     {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "i"}] * 65}, 400, "at most 64 questions"),
    ("000 OpenAI: 2-26 choices", "vllm", "/v1/decisions",
     {"model": "m", "input": "x", "questions": [{"type": "choice", "instructions": "i", "choices": [{"value": f"c{i}"} for i in range(27)]}]},
     400, "26"),
    ("000 OpenAI: input accepts a string or an array of user messages (other roles are rejected)", "vllm", "/v1/decisions",
     {"model": "m", "input": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
      "questions": [{"type": "predicate", "instructions": "i"}]}, 400, "only user messages"),
]


@pytest.mark.parametrize("check", SEED_003_ERRORS + SEED_003_SYSTEM_ONE + SEEDS_000_001_VLLM, ids=lambda c: c[0])
def test_seed_sentence(servers: dict[str, str], check: Check) -> None:
    _sentence, profile, route, body, status, words = check
    r = httpx2.post(servers[profile] + route, json=body, timeout=120)
    assert r.status_code == status and words in r.text, (r.status_code, r.text[:400])


def test_003_model_is_echoed_as_default_when_omitted(servers: dict[str, str]) -> None:
    url = servers["sglang"] + "/v1/decisions"
    assert httpx2.post(url, json=sg(), timeout=60).json()["model"] == "default"
    assert httpx2.post(url, json=sg(model="my-model"), timeout=60).json()["model"] == "my-model"


def test_003_score_probabilities_are_keyed_by_level_index(servers: dict[str, str]) -> None:
    """Two equal level texts stay two levels."""
    r = httpx2.post(servers["sglang"] + "/v1/decisions", json=sg({"id": "s", "type": "score", "question": "q", "levels": ["same", "same", "other"]}), timeout=60)
    assert r.status_code == 200, r.text
    p = r.json()["answers"]["s"]["probabilities"]
    assert list(p) == ["0", "1", "2"] and abs(sum(p.values()) - 1) < 1e-9


def test_003_question_descriptions_and_levels_may_be_json(servers: dict[str, str]) -> None:
    """Rendered as compact JSON: the same answer as sending that text."""
    url = servers["sglang"] + "/v1/decisions"
    as_json = sg({"id": "u", "type": "yes_no", "question": {"ask": "late?", "days": [1, 2]}, "yes": ["refund", 1]},
                 return_prompt_token_ids=True)
    as_text = sg({"id": "u", "type": "yes_no", "question": '{"ask":"late?","days":[1,2]}', "yes": '["refund",1]'},
                 return_prompt_token_ids=True)
    a, b = (httpx2.post(url, json=body, timeout=60).json()["answers"]["u"] for body in (as_json, as_text))
    assert a["prompt_token_ids"] == b["prompt_token_ids"] and a["probabilities"] == b["probabilities"]


def test_000_noul_probabilities_are_keyed_yes_no(servers: dict[str, str]) -> None:
    r = httpx2.post(servers["vllm"] + "/v1/systemone", json=s1(), timeout=60)
    assert r.status_code == 200 and list(r.json()["answers"]["q"]["probabilities"]) == ["yes", "no"], r.text
